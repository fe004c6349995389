"""The tasks, each declared once (`TaskSpec`: what the runner, the summary and the nightly read), and
one (instance, task, setting) unit from the candidate's answer to its record.

A task bound to a run is the candidate's prompt plus a scorer; `--reference` adds a second scorer (other
decomposer, matcher and judge endpoints) that re-scores the same answer without asking the
candidate again, so two scorings of one run differ only in their judges.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from cupid.eval.benchmark import generation, inference, stats
from cupid.eval.benchmark.data import Instance
from cupid.eval.benchmark.figures import (
    Block,
    Figures,
    GenerationFigures,
    InferenceFigures,
    generation_tables,
    inference_tables,
)
from cupid.eval.benchmark.generation import GenerationScorer
from cupid.eval.benchmark.history import History, plain_log, relevant_sessions
from cupid.eval.benchmark.inference import InferenceScorer, matcher_dialect
from cupid.eval.benchmark.records import Scoring, UnitRecord
from cupid.eval.benchmark.settings import SETTINGS
from cupid.eval.benchmark.stages import StageFailed
from cupid.eval.benchmark.stats import Interval
from cupid.matcher import prompts, schemas
from cupid.matcher.scores import MatchCounts
from cupid.serving.client import ChatRequest, Client, RequestFailed
from cupid.serving.endpoint import Endpoint


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

    @property
    def figures(self) -> type[Figures]:
        """Its summary figures (`.of(scorings)`), as summary.json holds them: its block's."""
        return self.block.figures

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


NO_CREDIT = 1  # the judge scale's lowest score ("Unacceptable"): generation's credit for no answer


def _no_inference(record: UnitRecord, other: UnitRecord) -> dict[str, Any]:
    """No answer, scored so that it cannot raise a figure: every ground-truth item missed, and as many items
    predicted as the other run's answer predicted (at least one), none matched. Counted as predicting nothing, a
    failure would leave micro precision's denominator: a candidate that stopped answering where it answered worst
    would gain micro precision and F1. Against the other run's answer on the same unit, matched mass can only fall
    and predicted items only rise, so micro P, R and F1 cannot rise, and a unit's own F1 is 0."""
    predicted = max(other.counts.n_predicted if other.scored and other.counts else 0, 1)
    counts = MatchCounts(0.0, predicted, 0.0, len(record.gt_checklist or []))
    return {"counts": counts, "scores": counts.prf()}


def _score_columns(scoring: Scoring) -> list[float] | None:
    return None if scoring.score is None else [float(scoring.score), 1.0]


INFERENCE = TaskSpec(
    name="inference",
    title="Inference: preference match",
    candidate_stage="infer",
    answer_stages=("infer", "parse_preference"),
    no_answer=_no_inference,
    settings=("standard", "oracle", "summary"),  # its answer is the preference: oracle-preference would give it away
    messages=inference.candidate_messages,
    answer_format=schemas.inference_answer,
    roles=("decomposer", "matcher"),
    scorer=lambda client, roles: InferenceScorer(
        client, roles["decomposer"], roles["matcher"], matcher_dialect(client.endpoints[roles["matcher"]])
    ),
    columns=lambda scoring: stats.prf_row(scoring.match_counts()),
    statistic=stats.prf,
    metrics=tuple(f"{aggregate}_{name}" for aggregate in ("micro", "macro") for name in ("precision", "recall", "f1")),
    scale=100,
    points="F1 points",
    headline=("micro_f1", "macro_f1"),  # micro: the published aggregate
    bounds=(0.0, 1.0),
    prompts=("inference", "decomposer", "prefmatcher", "matcher_fewshot"),
    unit_score=lambda record: round(100 * record.scores.f1, 1) if record.scores else None,  # F1 in %
    ground_truth=("current_contextual_preference", "current_checklist"),
    reward_metrics=("f1", "precision", "recall"),
    reward_of=lambda scoring, metric: float(getattr(scoring.scores, metric)) if scoring.scores else None,
    block=Block(InferenceFigures, inference_tables),
)
GENERATION = TaskSpec(
    name="generation",
    title="Generation: judge score",
    candidate_stage="generate",
    answer_stages=("generate",),
    no_answer=lambda record, other: {"score": NO_CREDIT},
    settings=SETTINGS,
    messages=generation.candidate_messages,
    answer_format=None,  # generation answers are free text: nothing to constrain
    roles=("judge",),
    scorer=lambda client, roles: GenerationScorer(client, roles["judge"]),
    columns=_score_columns,
    statistic=stats.mean_score,
    metrics=("mean_score",),
    scale=1,
    points="judge-score points",
    headline=("mean_score",),
    bounds=(NO_CREDIT, 10),  # the judge's 1-10
    prompts=("generation", "judge", prompts.ORACLE_PREFERENCE),
    unit_score=lambda record: record.score,  # the judge's 1-10
    ground_truth=("current_contextual_preference", "current_checklist", "current_request"),
    reward_metrics=("score",),
    reward_of=lambda scoring, metric: None if scoring.score is None else (scoring.score - 1) / 9,  # 1-10 to [0, 1]
    block=Block(GenerationFigures, generation_tables),
)
TASKS = {
    spec.name: spec for spec in (INFERENCE, GENERATION)
}  # in ranking order: the nightly ranks by the first a run has

if TYPE_CHECKING:
    TaskName = str
else:  # a task's name, checked against the declared tasks (a config's `tasks:`, a reward's `task`)
    TaskName = Literal[tuple(TASKS)]


def candidate_constrained(candidate: Endpoint, task: str) -> bool:
    """The candidate's answers are held to the task's format (`constrain_candidate`): recorded with the run."""
    return candidate.constrain_candidate and TASKS[task].answer_format is not None


@dataclass(frozen=True)
class Task:
    """A task bound to a run: its client, candidate, history and scorers."""

    spec: TaskSpec
    client: Client
    candidate: str
    history: History
    scorer: Scorer
    reference: Scorer | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def constrained(self) -> bool:
        return candidate_constrained(self.client.endpoints[self.candidate], self.name)

    def _request(self, log: str, instance: Instance, setting: str) -> ChatRequest:
        answer_format = self.spec.answer_format if self.constrained else None
        fmt = answer_format(self.client.endpoints[self.candidate].max_tokens) if answer_format else {}
        return self.client.request(self.candidate, self.spec.messages(log, instance, setting), **fmt)

    def plain_request(self, instance: Instance, setting: str) -> ChatRequest:
        """The candidate's request where no model call is needed to build it (every setting but summary)."""
        return self._request(plain_log(instance, setting), instance, setting)

    async def candidate_request(self, instance: Instance, setting: str) -> ChatRequest:
        return self._request(await self.history.log(instance, setting), instance, setting)

    async def run(self, instance: Instance, setting: str) -> UnitRecord:
        unit = unit_record(self.spec, instance, setting)
        try:
            request = await self.candidate_request(instance, setting)
            try:
                answer = (await self.client.send(self.candidate, request)).content
            except RequestFailed as e:
                raise StageFailed(self.spec.candidate_stage, e.reason, e.detail) from None
        except StageFailed as e:
            unit.error = e.error
            return unit
        return await scored(unit, instance, answer, self.scorer, self.reference)


def unit_record(spec: TaskSpec, instance: Instance, setting: str) -> UnitRecord:
    """A unit before its answer: which one it is, and the ground truth its judges are shown."""
    return UnitRecord(
        key=instance.key,
        persona_id=instance.persona_id,
        instance_type=instance.instance_type,
        task=spec.name,
        setting=setting,
        n_sessions=len(instance.sessions(setting)),
        relevant_sessions=relevant_sessions(instance),
        gt_preference=instance.current_contextual_preference,
        gt_checklist=list(instance.current_checklist),
    )


async def scored(
    unit: UnitRecord, instance: Instance, answer: str, scorer: Scorer, reference: Scorer | None = None
) -> UnitRecord:
    """The unit's record once the candidate answered: the scorer's scoring (and the reference's) of the answer.
    What every way of asking the candidate shares (this runner, inspect-ai's)."""
    record = unit.model_copy(update={**dict(await scorer.score(instance, answer)), "candidate_answer": answer})
    if reference is not None:
        record.reference = await reference.score(instance, answer)
    return record
