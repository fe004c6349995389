"""Task 1, preference inference, all of it: the candidate's prompt, the scorer (parse the candidate's answer ->
decompose -> match both directions, concurrently -> precision/recall/F1 for the instance, spec §3), a unit's columns
and the statistic every figure comes from, the summary's figures and tables, and the task's declaration (`INFERENCE`).
A new figure is a column here, a name in `prf`, and a field in `InferenceFigures`: the summary, the report, the
comparison's rows and the tracker read them from the declaration.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Self

import numpy as np

from cupid.eval.benchmark.data import Instance
from cupid.eval.benchmark.figures import GROUPS, Block, Figures, Table, TaskBlock
from cupid.eval.benchmark.records import DIRECTIONS, Scoring, UnitRecord
from cupid.eval.benchmark.stages import ask, judge_params, parsed, stage_by_stage
from cupid.eval.benchmark.stats import ratio
from cupid.eval.benchmark.taskspec import TaskSpec
from cupid.matcher import parse, prompts, schemas
from cupid.matcher.prompts import MatcherDialect
from cupid.matcher.scores import PRF, MatchCounts
from cupid.serving.client import Client
from cupid.serving.endpoint import Endpoint


def matcher_dialect(endpoint: Endpoint) -> MatcherDialect:
    """The matcher prompt an endpoint gets: its own `matcher_prompt`, else the one its model was trained on."""
    return endpoint.matcher_prompt or prompts.matcher_dialect_for(endpoint.model)


def candidate_messages(log: str, instance: Instance, setting: str) -> list[dict[str, str]]:
    return prompts.inference(log, instance.current_request)


@dataclass(frozen=True)
class InferenceScorer:
    client: Client
    decomposer: str
    matcher: str
    matcher_dialect: MatcherDialect

    async def ask_decomposer(self, preference: str) -> str:
        fmt = judge_params(self.client, "decomposer", self.decomposer, schemas.decomposer)
        return await ask(self.client, "decompose", self.decomposer, prompts.decomposer(preference), **fmt)

    async def ask_matcher(self, stage: str, preference: str, items: list[str]) -> str:
        fmt = judge_params(
            self.client, "matcher", self.matcher, lambda cap: schemas.matcher(self.matcher_dialect, items, cap)
        )
        return await ask(
            self.client, stage, self.matcher, prompts.matcher(preference, items, self.matcher_dialect), **fmt
        )

    async def match(self, stage: str, preference: str, items: list[str]) -> list[parse.MatchItem]:
        return parsed(stage, parse.matches, await self.ask_matcher(stage, preference, items), items)

    async def score(self, instance: Instance, answer: str) -> Scoring:
        """The candidate's answer: its preference parsed, then scored as `score_preference` does."""
        return await self.score_answer(answer, instance.current_contextual_preference, list(instance.current_checklist))

    async def score_truth(self, answer: str, truth: dict[str, Any]) -> Scoring:
        return await self.score_answer(answer, truth["current_contextual_preference"], list(truth["current_checklist"]))

    async def score_answer(self, answer: str, gt_preference: str, gt: list[str]) -> Scoring:
        """A candidate's answer against the ground truth (what `score` asks of an instance, and the reward of it)."""

        async def stages(scoring: Scoring) -> None:
            preference = parsed("parse_preference", parse.preference, answer)
            await self._preference_stages(scoring, preference, gt_preference, gt)

        return await stage_by_stage(stages)

    async def score_preference(self, preference: str, gt_preference: str, gt: list[str]) -> Scoring:
        """An inferred preference against the ground truth: decompose, then match both directions."""
        return await stage_by_stage(lambda scoring: self._preference_stages(scoring, preference, gt_preference, gt))

    async def _preference_stages(self, scoring: Scoring, preference: str, gt_preference: str, gt: list[str]) -> None:
        scoring.inferred_preference = preference
        scoring.decomposer_answer = await self.ask_decomposer(preference)
        inferred = scoring.inferred_checklist = parsed("decompose", parse.checklist, scoring.decomposer_answer)
        if not inferred:
            # The decomposer really answered an empty list: nothing can match (the reference does the same).
            scoring.infer_to_gt, scoring.gt_to_infer = [], []
            _counted(scoring, MatchCounts(0.0, 0, 0.0, len(gt)))
            return
        asked = {"infer_to_gt": (gt_preference, inferred), "gt_to_infer": (preference, gt)}
        answers = await asyncio.gather(
            *(self.ask_matcher(f"match_{d}", *asked[d]) for d in DIRECTIONS),
            return_exceptions=True,  # let both finish: the one that succeeded is cached for the resume
        )
        scoring.matcher_answers = {d: a for d, a in zip(DIRECTIONS, answers, strict=True) if isinstance(a, str)}
        labelled = {}
        for direction, outcome in zip(DIRECTIONS, answers, strict=True):
            if isinstance(outcome, BaseException):
                raise outcome
            labelled[direction] = parsed(f"match_{direction}", parse.matches, outcome, asked[direction][1])
            setattr(scoring, direction, list(labelled[direction]))
        labels = [[m.label for m in labelled[d]] for d in DIRECTIONS]
        _counted(scoring, MatchCounts.from_labels(*labels))


def _counted(scoring: Scoring, counts: MatchCounts) -> None:
    scoring.counts, scoring.scores = counts, counts.prf()


# ---------------------------------------------------------------- its figures

PRF_COLUMNS = (
    "predicted_matched",
    "n_predicted",
    "true_matched",
    "n_true",
    "precision",
    "recall",
    "f1",
    "units",
    "missed",
)


def prf_row(counts: MatchCounts) -> list[float]:
    """One unit's `PRF_COLUMNS`, its P/R/F1 the matcher's own (`MatchCounts.prf`, as its record holds them)."""
    scores = counts.prf()
    return [
        counts.predicted_matched,
        counts.n_predicted,
        counts.true_matched,
        counts.n_true,
        scores.precision,
        scores.recall,
        scores.f1,
        1.0,
        float(scores.f1 == 0),
    ]


def prf_columns(counts: np.ndarray | list[list[float]]) -> np.ndarray:
    """`prf_row` of many units at once, from their (predicted_matched, n_predicted, true_matched, n_true) rows: the
    simulations' columns (tests/eval/test_stats.py checks the two agree to the bit). A unit's own stays `prf_row`,
    on every comparison's path, where numpy's overhead on one row would cost more than the arithmetic."""
    c = np.atleast_2d(np.asarray(counts, dtype=float))
    p, r = ratio(c[:, 0], c[:, 1]), ratio(c[:, 2], c[:, 3])
    f1 = ratio(2 * p * r, p + r)
    return np.column_stack([c[:, :4], p, r, f1, np.ones(len(c)), f1 == 0])


def micro_f1(sums: np.ndarray) -> np.ndarray:
    """Micro F1 from sums of `PRF_COLUMNS`: F1 of the ratios of summed counts (the published aggregate)."""
    s = np.asarray(sums, dtype=float)
    p, r = ratio(s[..., 0], s[..., 1]), ratio(s[..., 2], s[..., 3])
    return ratio(2 * p * r, p + r)


def prf(sums: np.ndarray) -> dict[str, np.ndarray]:
    """Micro (ratios of summed counts) and macro (summed per-unit scores over units) P/R/F1, and the share of units
    whose F1 is 0 (a preference missed entirely), from sums of `PRF_COLUMNS`."""
    s = np.asarray(sums, dtype=float)
    units = s[..., 7]
    return {
        "micro_precision": ratio(s[..., 0], s[..., 1]),
        "micro_recall": ratio(s[..., 2], s[..., 3]),
        "micro_f1": micro_f1(s),
        "macro_precision": ratio(s[..., 4], units),
        "macro_recall": ratio(s[..., 5], units),
        "macro_f1": ratio(s[..., 6], units),
        "missed": ratio(s[..., 8], units),
    }


class InferenceFigures(Figures):
    micro: PRF | None = None  # sums over instances: the reference code's, the published numbers
    macro: PRF | None = None  # mean of per-instance scores: the paper's text
    missed: float | None = None  # the share of units with F1 = 0

    @classmethod
    def of(cls, scorings: list[Scoring], values: dict[str, float]) -> Self:
        def prf_of(average: str) -> PRF | None:
            return PRF(*(values[f"{average}_{k}"] for k in ("precision", "recall", "f1"))) if values else None

        return cls(**cls._counts(scorings), micro=prf_of("micro"), macro=prf_of("macro"), missed=values.get("missed"))


def inference_tables(title: str, block: TaskBlock[InferenceFigures]) -> list[Table]:
    return [_table(title, block, average) for average in ("micro", "macro")]


def _table(title: str, block: TaskBlock[InferenceFigures], average: str) -> Table:
    """P/R/F1 in one average; the macro table, of per-unit scores, also the share of units missed (F1 = 0)."""
    shares = ("F1=0",) if average == "macro" else ()
    headers = ["instances"] + [f"{s} {m}" for s in block.settings for m in ("P", "R", "F1", *shares, "n")]
    rows = []
    for group in GROUPS:
        cells = [group]
        for setting in block.settings.values():
            figures = setting.group(group)
            got: PRF | None = getattr(figures, average)
            cells += [INFERENCE.show(None if got is None else getattr(got, k)) for k in ("precision", "recall", "f1")]
            cells += [INFERENCE.show(figures.missed) for _ in shares] + [figures.n]
        rows.append(cells)
    return Table(f"{title}: preference match, {average} (%)", headers, rows)


def _no_answer(record: UnitRecord, other: UnitRecord) -> dict[str, Any]:
    """No answer, scored so that it cannot raise a figure: every ground-truth item missed, and as many items
    predicted as the other run's answer predicted (at least one), none matched. Counted as predicting nothing, a
    failure would leave micro precision's denominator: a candidate that stopped answering where it answered worst
    would gain micro precision and F1. Against the other run's answer on the same unit, matched mass can only fall
    and predicted items only rise, so micro P, R and F1 cannot rise, and a unit's own F1 is 0."""
    predicted = max(other.counts.n_predicted if other.scored and other.counts else 0, 1)
    counts = MatchCounts(0.0, predicted, 0.0, len(record.gt_checklist or []))
    return {"counts": counts, "scores": counts.prf()}


INFERENCE = TaskSpec(
    name="inference",
    title="Inference: preference match",
    candidate_stage="infer",
    answer_stages=("infer", "parse_preference"),
    no_answer=_no_answer,
    settings=("standard", "oracle", "summary"),  # its answer is the preference: oracle-preference would give it away
    messages=candidate_messages,
    answer_format=schemas.inference_answer,
    roles=("decomposer", "matcher"),
    scorer=lambda client, roles: InferenceScorer(
        client, roles["decomposer"], roles["matcher"], matcher_dialect(client.endpoints[roles["matcher"]])
    ),
    columns=lambda scoring: prf_row(scoring.match_counts()),
    statistic=prf,
    metrics=tuple(prf(np.zeros(len(PRF_COLUMNS)))),
    scale=100,
    digits=1,
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
