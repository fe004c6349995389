"""The grid a run's figures sit on, task x setting x instance type, walked and named in one place: the report, the
tracker, the nightly and the comparison read it so, and `summary.json`'s figures are named so in a tracker.

A figure's name is `<task>/<setting>[/<instance type>]/<figure>` (`inference/standard/micro_f1`,
`inference/oracle/changing/macro_recall`, `generation/standard/mean_score`); no instance type: all of them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

from cupid.eval.benchmark.data import INSTANCE_TYPES
from cupid.eval.benchmark.records import UnitRecord

R = TypeVar("R", bound=UnitRecord)


def cell_name(task: str, setting: str, instance_type: str | None, prefix: str = "") -> str:
    """`[prefix/]<task>/<setting>[/<type>]`: where a cell's figures are named."""
    return "/".join([*([prefix] if prefix else []), task, setting, *([instance_type] if instance_type else [])])


def figure_name(task: str, setting: str, instance_type: str | None, figure: str, prefix: str = "") -> str:
    """`[prefix/]<task>/<setting>[/<type>]/<figure>`."""
    return f"{cell_name(task, setting, instance_type, prefix)}/{figure}"


def groups(records: Sequence[R]) -> list[tuple[str | None, list[R]]]:
    """All the records (None), then those of each instance type."""
    return [(None, list(records))] + [(t, [r for r in records if r.instance_type == t]) for t in INSTANCE_TYPES]


def cells(records: Sequence[R], by_type: bool = True) -> Iterator[tuple[str, str, str | None, list[R]]]:
    """(task, setting, instance type or None, its records) for each task and setting the records hold, in the order
    they first appear; with `by_type`, each instance type's cell after the setting's whole."""
    for task, setting in dict.fromkeys((r.task, r.setting) for r in records):
        these = [r for r in records if (r.task, r.setting) == (task, setting)]
        for instance_type, chosen in groups(these) if by_type else [(None, these)]:
            yield task, setting, instance_type, chosen
