"""Task 2, generation, scored: the judge rates the candidate's response 1-10 against the
ground-truth preference and its checklist (spec §3, "preference alignment").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cupid.eval.benchmark.data import Instance
from cupid.eval.benchmark.records import Scoring
from cupid.eval.benchmark.stages import ask, judge_params, parsed, stage_by_stage
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
