"""Task 2, generation, scored: the judge rates the candidate's response 1-10 against the
ground-truth preference and its checklist (spec §3, "preference alignment").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cupid.eval.chain import ask, constraint, parsed
from cupid.eval.data import Instance
from cupid.matcher import parse, prompts, schemas
from cupid.serving.client import Client

TASK = "generation"


def candidate_messages(log: str, instance: Instance, setting: str) -> list[dict[str, str]]:
    if setting == "oracle-preference":
        return prompts.generation_with_preference(instance.current_contextual_preference, instance.current_request)
    return prompts.generation(log, instance.current_request)


@dataclass(frozen=True)
class GenerationScorer:
    client: Client
    judge: str

    async def score(self, instance: Instance, answer: str, record: dict[str, Any]) -> None:
        messages = prompts.judge(
            instance.current_contextual_preference, instance.current_checklist, instance.current_request, answer
        )
        judged = await ask(self.client, "judge", self.judge, messages, **constraint(self.client, self.judge, schemas.judge))
        record["judge_answer"] = judged
        record["score"] = parsed("judge", parse.score, judged)
