"""Task 1, preference inference, scored: parse the candidate's answer -> decompose -> match both
directions (concurrently) -> precision/recall/F1 for the instance (spec §3).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from cupid.eval.benchmark.data import Instance
from cupid.eval.benchmark.records import DIRECTIONS, Scoring
from cupid.eval.benchmark.stages import ask, judge_params, parsed, stage_by_stage
from cupid.matcher import parse, prompts, schemas
from cupid.matcher.prompts import MatcherDialect
from cupid.matcher.scores import MatchCounts
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
