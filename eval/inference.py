"""Task 1, preference inference, as one async chain per instance:
infer -> parse -> decompose -> match both directions (concurrently) -> score.

A stage that fails ends the chain with a record that names the stage, the reason and the raw
answer; such an instance is counted as failed and kept out of every average.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from eval.data import Instance
from matcher import parse, prompts, schemas
from matcher.prompts import MatcherDialect
from matcher.scores import MatchCounts
from serving.client import Client, RequestFailed

TASK = "inference"


@dataclass(frozen=True)
class Roles:
    candidate: str
    decomposer: str
    matcher: str


class StageFailed(Exception):
    def __init__(self, stage: str, reason: str, detail: str, raw: str | None = None):
        super().__init__(f"{stage}: {reason}: {detail}")
        self.error = {"stage": stage, "reason": reason, "detail": detail, "raw": raw}


async def _ask(client: Client, stage: str, endpoint: str, messages: list[dict[str, str]], **params: Any) -> str:
    try:
        return (await client.chat(endpoint, messages, **params)).content
    except RequestFailed as e:
        raise StageFailed(stage, e.reason, e.detail) from None


def _parsed(stage: str, parser, answer: str, *args):
    try:
        return parser(answer, *args)
    except parse.ParseError as e:
        raise StageFailed(stage, "parse_error", e.message, e.raw) from None


@dataclass(frozen=True)
class InferenceTask:
    """Everything a chain needs besides the instance: the client, the roles and their prompt formats."""

    client: Client
    roles: Roles
    matcher_dialect: MatcherDialect

    def _structured(self, role: str) -> bool:
        return self.client.endpoints[getattr(self.roles, role)].structured_output

    def candidate_request(self, instance: Instance, setting: str):
        messages = prompts.inference(instance.sessions(setting), instance.current_request)
        return self.client.request(self.roles.candidate, messages)

    async def decompose(self, preference: str) -> list[str]:
        fmt = schemas.decomposer() if self._structured("decomposer") else None
        answer = await _ask(self.client, "decompose", self.roles.decomposer, prompts.decomposer(preference), response_format=fmt)
        return _parsed("decompose", parse.checklist, answer)

    async def match(self, stage: str, preference: str, items: list[str]) -> list[parse.Match]:
        fmt = schemas.matcher(self.matcher_dialect, len(items)) if self._structured("matcher") else None
        messages = prompts.matcher(preference, items, self.matcher_dialect)
        answer = await _ask(self.client, stage, self.roles.matcher, messages, response_format=fmt)
        return _parsed(stage, parse.matches, answer, items)

    async def run(self, instance: Instance, setting: str) -> dict[str, Any]:
        record: dict[str, Any] = {
            "key": instance.key,
            "persona_id": instance.persona_id,
            "instance_type": instance.instance_type,
            "task": TASK,
            "setting": setting,
            "gt_preference": instance.current_contextual_preference,
            "gt_checklist": list(instance.current_checklist),
        }
        try:
            record.update(await self._chain(instance, setting, record))
            record["status"] = "scored"
            record["error"] = None
        except StageFailed as e:
            record["status"] = "failed"
            record["error"] = e.error
        return record

    async def _chain(self, instance: Instance, setting: str, record: dict[str, Any]) -> dict[str, Any]:
        request = self.candidate_request(instance, setting)
        try:
            answer = (await self.client.send(self.roles.candidate, request)).content
        except RequestFailed as e:
            raise StageFailed("infer", e.reason, e.detail) from None
        record["candidate_answer"] = answer
        preference = _parsed("parse_preference", parse.preference, answer)
        record["inferred_preference"] = preference

        inferred = await self.decompose(preference)
        record["inferred_checklist"] = inferred
        gt = list(instance.current_checklist)
        if not inferred:
            # The decomposer really answered an empty list: nothing can match (the reference does the same).
            counts = MatchCounts(0.0, 0, 0.0, len(gt))
            return {"infer_to_gt": [], "gt_to_infer": [], "counts": vars(counts), "scores": counts.prf().as_dict()}

        both = await asyncio.gather(
            self.match("match_infer_to_gt", instance.current_contextual_preference, inferred),
            self.match("match_gt_to_infer", preference, gt),
            return_exceptions=True,  # let both finish: the one that succeeded is cached for the resume
        )
        for outcome in both:
            if isinstance(outcome, BaseException):
                raise outcome
        infer_to_gt, gt_to_infer = both
        counts = MatchCounts.from_labels([m.label for m in infer_to_gt], [m.label for m in gt_to_infer])
        return {
            "infer_to_gt": [vars(m) for m in infer_to_gt],
            "gt_to_infer": [vars(m) for m in gt_to_infer],
            "counts": vars(counts),
            "scores": counts.prf().as_dict(),
        }
