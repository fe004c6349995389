"""Task 1, preference inference, scored: parse the candidate's answer -> decompose -> match both
directions (concurrently) -> precision/recall/F1 for the instance (spec §3).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from cupid.eval.chain import ask, constraint, parsed
from cupid.eval.data import Instance
from cupid.matcher import parse, prompts, schemas
from cupid.matcher.prompts import MatcherDialect
from cupid.matcher.scores import MatchCounts
from cupid.serving.client import Client

TASK = "inference"


def candidate_messages(log: str, instance: Instance, setting: str) -> list[dict[str, str]]:
    return prompts.inference(log, instance.current_request)


@dataclass(frozen=True)
class InferenceScorer:
    client: Client
    decomposer: str
    matcher: str
    matcher_dialect: MatcherDialect

    async def decompose(self, preference: str) -> list[str]:
        fmt = constraint(self.client, self.decomposer, schemas.decomposer)
        answer = await ask(self.client, "decompose", self.decomposer, prompts.decomposer(preference), **fmt)
        return parsed("decompose", parse.checklist, answer)

    async def match(self, stage: str, preference: str, items: list[str]) -> list[parse.Match]:
        fmt = constraint(self.client, self.matcher, lambda cap: schemas.matcher(self.matcher_dialect, items, cap))
        messages = prompts.matcher(preference, items, self.matcher_dialect)
        answer = await ask(self.client, stage, self.matcher, messages, **fmt)
        return parsed(stage, parse.matches, answer, items)

    async def score(self, instance: Instance, answer: str, record: dict[str, Any]) -> None:
        """Fills `record` stage by stage, so a failure keeps what was computed before it."""
        preference = parsed("parse_preference", parse.preference, answer)
        record["inferred_preference"] = preference
        await self.score_preference(preference, instance.current_contextual_preference, list(instance.current_checklist), record)

    async def score_preference(self, preference: str, gt_preference: str, gt: list[str], record: dict[str, Any]) -> None:
        """An inferred preference against the ground truth: decompose, then match both directions."""
        inferred = await self.decompose(preference)
        record["inferred_checklist"] = inferred
        if not inferred:
            # The decomposer really answered an empty list: nothing can match (the reference does the same).
            counts = MatchCounts(0.0, 0, 0.0, len(gt))
            record.update(infer_to_gt=[], gt_to_infer=[], counts=vars(counts), scores=counts.prf().as_dict())
            return
        both = await asyncio.gather(
            self.match("match_infer_to_gt", gt_preference, inferred),
            self.match("match_gt_to_infer", preference, gt),
            return_exceptions=True,  # let both finish: the one that succeeded is cached for the resume
        )
        for outcome in both:
            if isinstance(outcome, BaseException):
                raise outcome
        infer_to_gt, gt_to_infer = both
        counts = MatchCounts.from_labels([m.label for m in infer_to_gt], [m.label for m in gt_to_infer])
        record.update(
            infer_to_gt=[vars(m) for m in infer_to_gt],
            gt_to_infer=[vars(m) for m in gt_to_infer],
            counts=vars(counts),
            scores=counts.prf().as_dict(),
        )

