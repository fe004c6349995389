"""What a task is (`TaskSpec`), knowing no task: each task declares itself in its own module
(`eval.benchmark.inference`, `eval.benchmark.generation`: its prompt, scorer, columns, statistic, figures, tables and
how its figures are shown), and `eval.benchmark.tasks` lists them. A figure is computed once: the task's statistic
at its units' column sums is the summary's value and the interval's estimate, and at resampled sums the interval."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from cupid.eval.benchmark import stats
from cupid.eval.benchmark.data import Instance
from cupid.eval.benchmark.figures import Block, Figures
from cupid.eval.benchmark.records import Scoring, UnitRecord
from cupid.eval.benchmark.stats import Interval
from cupid.serving.client import Client


class Scorer(Protocol):
    async def score(self, instance: Instance, answer: str) -> Scoring: ...

    async def score_truth(self, answer: str, truth: dict[str, Any]) -> Scoring:
        """The answer against the ground truth as a dataset row holds it (`TaskSpec.ground_truth`'s columns)."""
        ...


@dataclass(frozen=True)
class TaskSpec:
    """A task, declared once: what the runner, the summary and the nightly need to know about it."""

    name: str
    title: str  # what it measures, as report titles say it
    candidate_stage: str  # the stage a candidate that gave no answer failed at
    answer_stages: tuple[str, ...]  # the stages whose failure is the candidate's own (no response, nothing parsed)
    # the scoring of an empty answer, given the other run's record of the unit: what a comparison counts
    no_answer: Callable[[UnitRecord, UnitRecord], dict[str, Any]]
    settings: tuple[str, ...]  # the settings it runs in (`settings.SETTINGS`'s order)
    messages: Callable[[str, Instance, str], list[dict[str, str]]]  # the candidate's prompt: (log, instance, setting)
    # what a constrained candidate is held to; None: free text
    answer_format: Callable[[int | None], dict[str, Any]] | None
    roles: tuple[str, ...]  # the judge roles that score it
    scorer: Callable[[Client, dict[str, str]], Scorer]  # from the endpoint name of each role
    columns: Callable[[Scoring], list[float] | None]  # a scored unit's columns (None: it gives no figure)
    statistic: stats.Statistic  # its figures from column sums: ratios of sums, recomputed on each resample
    metrics: tuple[str, ...]  # the names `statistic` gives, in the order tables show them
    scale: float  # how a figure is shown (100: as a percentage)
    digits: int  # the decimals a shown figure has
    points: str  # the unit of a shown figure's difference (a gate's margin is in it)
    headline: tuple[str, ...]  # the estimates the nightly compares night to night; the first ranks the leaderboard
    # the first headline's range on any units: the gate's persona-level changes, mapped to [-1, 1], are bounded by it
    bounds: tuple[float, float]
    prompts: tuple[str, ...]  # the prompts whose versions make a run's identity
    unit_score: Callable[[UnitRecord], float | None]  # one scored unit's figure, as the viewer lists it
    ground_truth: tuple[str, ...]  # the instance's fields its scorer reads (a reward dataset's columns)
    reward_metrics: tuple[str, ...]  # the figures a reward may give (the first by default)
    reward_of: Callable[[Scoring, str], float | None]  # a scored unit's reward in [0, 1] under one of them
    block: Block  # how summary.json holds its figures and summary.md shows them

    def show(self, value: float | None, signed: bool = False) -> str:
        """A figure, or with `signed` a difference, as every table, report, leaderboard and verdict prints it."""
        return "-" if value is None else f"{self.scale * value:{'+' if signed else ''}.{self.digits}f}"

    def show_interval(self, interval: Interval | None) -> str:
        """`41.2 [38.0, 44.1]`, or the estimate and why there is no interval."""
        return "-" if interval is None else interval.text(self.scale, self.digits)

    def units(self, records: Iterable[UnitRecord], reference: bool = False) -> tuple[list[str], np.ndarray]:
        """The task's scored units' personas and columns (of the run's own scoring, or its reference's)."""
        personas, rows = [], []
        for record in records:
            if record.task != self.name:
                continue
            scoring = record.scoring(reference)
            if scoring.scored and (columns := self.columns(scoring)) is not None:
                personas.append(record.persona_id)
                rows.append(columns)
        return personas, np.array(rows, dtype=float) if rows else np.zeros((0, 0))

    def point(self, records: Iterable[UnitRecord], reference: bool = False) -> dict[str, float]:
        """Its figures on the scored units ({} for none): the estimates `intervals` gives, without resampling."""
        return stats.point(*self.units(records, reference), self.statistic)

    def figures(self, records: Sequence[UnitRecord], reference: bool = False) -> Figures:
        """Its summary figures, as summary.json holds them: counts of the units, and `point`'s values."""
        return self.block.figures.of([r.scoring(reference) for r in records], self.point(records, reference))

    def persona_figures(self, personas: Sequence[str] | np.ndarray, columns: np.ndarray) -> np.ndarray:
        """The first headline figure on each persona's own units (personas in sorted order), mapped from `bounds` to
        [0, 1]: what the gate's test compares persona by persona."""
        _, (sums,) = stats.by_persona(personas, np.asarray(columns, dtype=float))
        low, high = self.bounds
        return np.clip((self.statistic(sums)[self.headline[0]] - low) / (high - low), 0.0, 1.0)

    def intervals(self, records: Iterable[UnitRecord], reference: bool = False) -> dict[str, Interval]:
        """Its figures on the scored units, each with its interval over personas (`eval.benchmark.stats`)."""
        return stats.intervals(*self.units(records, reference), self.statistic)

    def candidate_failed(self, record: Scoring) -> bool:
        """The unit failed because of the candidate (no response, no preference in its answer), not of a judge."""
        return not record.scored and record.error is not None and record.error.stage in self.answer_stages

    def for_verdict(self, record: UnitRecord, other: UnitRecord) -> UnitRecord | None:
        """The unit as a comparison with `other` (the other run's record of it) counts it: scored as it is; the
        candidate's own failure scored as no answer (`no_answer`, its error kept), which no figure can gain from;
        None where a judge failed (nothing to say of the candidate)."""
        if record.scored:
            return record
        if self.candidate_failed(record):
            return record.model_copy(update={**self.no_answer(record, other), "status": "scored"})
        return None
