"""One (instance, task, setting) unit from the candidate's answer to its record.

A task is the candidate's prompt plus a scorer; `--reference` adds a second scorer (other
decomposer, matcher and judge endpoints) that re-scores the same answer without asking the
candidate again, so two scorings of one run differ only in their judges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from cupid.eval import generation, inference
from cupid.eval.chain import StageFailed
from cupid.eval.data import Instance
from cupid.eval.history import History, relevant_sessions
from cupid.eval.records import Scoring, UnitRecord
from cupid.matcher import schemas
from cupid.serving.client import ChatRequest, Client, RequestFailed
from cupid.serving.endpoints import Endpoint

TASKS = ("inference", "generation")
CANDIDATE_STAGE = {"inference": "infer", "generation": "generate"}
PROMPTS = {"inference": inference.candidate_messages, "generation": generation.candidate_messages}


def candidate_constrained(candidate: Endpoint, task: str) -> bool:
    """The candidate's answers are held to the task's format (`constrain_candidate`): recorded with the run."""
    return candidate.constrain_candidate and task in schemas.CANDIDATE


class Scorer(Protocol):
    async def score(self, instance: Instance, answer: str) -> Scoring: ...


@dataclass(frozen=True)
class Task:
    name: str
    client: Client
    candidate: str
    history: History
    scorer: Scorer
    reference: Scorer | None = None

    @property
    def _messages(self) -> Callable[..., list[dict[str, str]]]:
        return PROMPTS[self.name]

    @property
    def constrained(self) -> bool:
        return candidate_constrained(self.client.endpoints[self.candidate], self.name)

    def _request(self, log: str, instance: Instance, setting: str) -> ChatRequest:
        fmt = schemas.CANDIDATE[self.name](self.client.endpoints[self.candidate].max_tokens) if self.constrained else {}
        return self.client.request(self.candidate, self._messages(log, instance, setting), **fmt)

    def plain_request(self, instance: Instance, setting: str) -> ChatRequest:
        """The candidate's request where no model call is needed to build it (every setting but summary)."""
        return self._request(self.history.plain_log(instance, setting), instance, setting)

    async def candidate_request(self, instance: Instance, setting: str) -> ChatRequest:
        log = "" if setting == "oracle-preference" else await self.history.log(instance, setting)
        return self._request(log, instance, setting)

    async def run(self, instance: Instance, setting: str) -> UnitRecord:
        unit = UnitRecord(
            key=instance.key,
            persona_id=instance.persona_id,
            instance_type=instance.instance_type,
            task=self.name,
            setting=setting,
            n_sessions=len(instance.sessions(setting)) if setting != "oracle-preference" else 0,
            relevant_sessions=relevant_sessions(instance),
            gt_preference=instance.current_contextual_preference,
            gt_checklist=list(instance.current_checklist),
        )
        try:
            request = await self.candidate_request(instance, setting)
            try:
                answer = (await self.client.send(self.candidate, request)).content
            except RequestFailed as e:
                raise StageFailed(CANDIDATE_STAGE[self.name], e.reason, e.detail) from None
        except StageFailed as e:
            unit.error = e.error
            return unit
        scoring = await self.scorer.score(instance, answer)
        record = unit.model_copy(update={**dict(scoring), "candidate_answer": answer})
        if self.reference is not None:
            record.reference = await self.reference.score(instance, answer)
        return record
