"""The tasks, in ranking order (`TASKS`; each declared in its own module, `eval.benchmark.inference` and
`eval.benchmark.generation`), and one (instance, task, setting) unit from the candidate's answer to its record.

A task bound to a run is the candidate's prompt plus a scorer; `--reference` adds a second scorer (other
decomposer, matcher and judge endpoints) that re-scores the same answer without asking the
candidate again, so two scorings of one run differ only in their judges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from cupid.eval.benchmark.data import Instance
from cupid.eval.benchmark.generation import GENERATION
from cupid.eval.benchmark.history import History, plain_log, relevant_sessions
from cupid.eval.benchmark.inference import INFERENCE
from cupid.eval.benchmark.records import UnitRecord
from cupid.eval.benchmark.stages import StageFailed
from cupid.eval.benchmark.taskspec import Scorer, TaskSpec
from cupid.serving.client import ChatRequest, Client, RequestFailed
from cupid.serving.endpoint import Endpoint

TASKS = {spec.name: spec for spec in (INFERENCE, GENERATION)}  # in ranking order: the nightly ranks by a run's first

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
        return await answered(unit, instance, answer, self.scorer, self.reference)


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


async def answered(
    unit: UnitRecord, instance: Instance, answer: str, scorer: Scorer, reference: Scorer | None = None
) -> UnitRecord:
    """The unit's record once the candidate answered: the scorer's scoring (and the reference's) of the answer.
    What every way of asking the candidate shares (this runner, inspect-ai's)."""
    record = unit.model_copy(update={**dict(await scorer.score(instance, answer)), "candidate_answer": answer})
    if reference is not None:
        record.reference = await reference.score(instance, answer)
    return record
