"""The settings (spec §1): what the candidate is shown of the user's past. `standard` shows all prior sessions,
`oracle` only those holding the current preference, `summary` each session's summary, and `oracle-preference` the
ground-truth preference instead of any history. Which settings a task runs in is the task's (`TaskSpec.settings`);
how each log is built is `history`'s. What a setting adds to a run (a role whose answers build its log, that role's
prompts) is declared here once (`SettingSpec`), and every reader (the runner, inspect-ai, the reward's dataset,
the history) asks it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, get_args

Setting = Literal["standard", "oracle", "oracle-preference", "summary"]
SETTINGS: tuple[str, ...] = get_args(Setting)  # in the order tables and pages show them


@dataclass(frozen=True)
class SettingSpec:
    """A setting, declared once: what it adds to a run beside its tasks'."""

    name: str
    # the role whose answers build the candidate's log (None: the log needs no model call, so a dry run can write
    # its requests)
    built_by: str | None = None
    prompts: tuple[str, ...] = ()  # the prompts it adds to a run's identity, whatever the task


SETTING_SPECS = {
    spec.name: spec
    for spec in (
        SettingSpec("standard"),
        SettingSpec("oracle"),
        SettingSpec("oracle-preference"),
        SettingSpec("summary", built_by="summarizer", prompts=("summarizer",)),
    )
}


def extra_roles(settings: Iterable[str]) -> list[str]:
    """The roles these settings add to a run's (in the settings' order, once each)."""
    return list(dict.fromkeys(r for s in settings if (r := SETTING_SPECS[s].built_by) is not None))


def extra_prompts(settings: Iterable[str]) -> list[str]:
    """The prompts these settings add to a run's identity."""
    return list(dict.fromkeys(p for s in settings for p in SETTING_SPECS[s].prompts))


def built_from_answers(settings: Iterable[str]) -> list[str]:
    """The settings whose log a model's answers build (a dry run cannot write their requests)."""
    return [s for s in settings if SETTING_SPECS[s].built_by is not None]
