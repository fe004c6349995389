"""Task 2, generation, all of it: the candidate's prompt, the scorer (the judge rates the candidate's response 1-10
against the ground-truth preference and its checklist, spec §3, "preference alignment"), a unit's columns and the
statistic its figure comes from, the summary's figures and table, and the task's declaration (`GENERATION`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self

import numpy as np

from cupid.eval.benchmark.data import Instance
from cupid.eval.benchmark.figures import GROUPS, Block, Figures, Table, TaskBlock
from cupid.eval.benchmark.records import Scoring
from cupid.eval.benchmark.settings import SETTINGS
from cupid.eval.benchmark.stages import ask, judge_params, parsed, stage_by_stage
from cupid.eval.benchmark.stats import ratio
from cupid.eval.benchmark.taskspec import TaskSpec
from cupid.matcher import parse, prompts, schemas
from cupid.serving.client import Client


def candidate_messages(log: str, instance: Instance, setting: str) -> list[dict[str, str]]:
    if setting == "oracle-preference":
        return prompts.generation_with_preference(instance.current_contextual_preference, instance.current_request)
    return prompts.generation(log, instance.current_request)


@dataclass(frozen=True)
class GenerationScorer:
    client: Client
    judge: str

    async def score(self, instance: Instance, answer: str) -> Scoring:
        return await self.score_response(
            instance.current_contextual_preference, instance.current_checklist, instance.current_request, answer
        )

    async def score_truth(self, answer: str, truth: dict[str, Any]) -> Scoring:
        preference, checklist = truth["current_contextual_preference"], list(truth["current_checklist"])
        return await self.score_response(preference, checklist, truth["current_request"], answer)

    async def score_response(self, preference: str, checklist: list[str], request: str, answer: str) -> Scoring:
        """A response to the request, judged against the ground truth (preference and checklist)."""
        return await stage_by_stage(lambda scoring: self._stages(preference, checklist, request, answer, scoring))

    async def _stages(self, preference: str, checklist: list[str], request: str, answer: str, scoring: Scoring) -> None:
        messages = prompts.judge(preference, checklist, request, answer)
        fmt = judge_params(self.client, "judge", self.judge, schemas.judge)
        scoring.judge_answer = await ask(self.client, "judge", self.judge, messages, **fmt)
        scoring.score = parsed("judge", parse.score, scoring.judge_answer)


# ---------------------------------------------------------------- its figures

NO_CREDIT = 1  # the judge scale's lowest score ("Unacceptable"): the credit for no answer


def score_columns(scoring: Scoring) -> list[float] | None:
    """A unit's (score, 1): summed, the scores and their number."""
    return None if scoring.score is None else [float(scoring.score), 1.0]


def mean_score(sums: np.ndarray) -> dict[str, np.ndarray]:
    """The mean judge score, from sums of (score, 1)."""
    s = np.asarray(sums, dtype=float)
    return {"mean_score": ratio(s[..., 0], s[..., 1])}


class GenerationFigures(Figures):
    mean_score: float | None = None  # the judge's 1-10

    @classmethod
    def of(cls, scorings: list[Scoring], values: dict[str, float]) -> Self:
        score = values.get("mean_score")
        return cls(**cls._counts(scorings), mean_score=None if score is None else round(score, 4))


def generation_tables(title: str, block: TaskBlock[GenerationFigures]) -> list[Table]:
    headers = ["instances"] + [f"{s} {m}" for s in block.settings for m in ("score", "n")]
    rows = []
    for group in GROUPS:
        cells = [group]
        for setting in block.settings.values():
            figures = setting.group(group)
            cells += [GENERATION.show(figures.mean_score), figures.n]
        rows.append(cells)
    return [Table(f"{title}: preference alignment, judge score 1-10", headers, rows)]


GENERATION = TaskSpec(
    name="generation",
    title="Generation: judge score",
    candidate_stage="generate",
    answer_stages=("generate",),
    no_answer=lambda record, other: {"score": NO_CREDIT},
    settings=SETTINGS,
    messages=candidate_messages,
    answer_format=None,  # generation answers are free text: nothing to constrain
    roles=("judge",),
    scorer=lambda client, roles: GenerationScorer(client, roles["judge"]),
    columns=score_columns,
    statistic=mean_score,
    metrics=tuple(mean_score(np.zeros(2))),
    scale=1,
    digits=2,
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
