"""One model step of a persona: send, read, check, retry; every raw answer is kept.

A retry is a different request, so the cache sends it instead of replaying the bad answer: its
last message gets the reason the previous answer was refused, just before its last line (the
instruction the model answers), prompts with a one-shot
example show another example (both move even a greedy server to another answer; small models heed
a note inside the instruction far more than a further chat turn), and it carries a new seed and a
temperature of at least `retry_temperature` (which moves a sampling server) and the config's
`retry_params`. When no attempt is usable, the step raises `StepFailed` and the persona fails
with that reason.

Every step states its answer's shape: a regex (`Shape`, built from `matcher.schemas`) of the form its
prompt asks for, given the characters of free text the step's cap leaves. Where the endpoint's engine
enforces structured output, the request carries it (`eval.benchmark.stages.constraint`, the one place that decides)
and the answer has that form by construction, ending within the cap even at one character per token;
elsewhere the prompt alone asks for it. Either way the step's reader checks everything again, and
content rules (a factor not named after its type, a request that names its factor ...) are checks only:
a refused answer is retried as above.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, TypeVar

from cupid.eval.benchmark.stages import constraint
from cupid.matcher import prompts, schemas
from cupid.serving.client import Client, RequestFailed
from cupid.training.synth.config import Role, SynthConfig
from cupid.training.synth.parse import Unusable, echoes, words

T = TypeVar("T")
Messages = list[dict[str, str]]
Shape = Callable[[int], str]  # the answer's regex, given the characters of free text it may hold

RETRY_TEXT = (resources.files("cupid.matcher") / "prompts" / "project_synth_retry.user.txt").read_text(encoding="utf-8")


def chat(prompt_name: str, **fields: str) -> Messages:
    """A prompt's messages; a prompt with an empty system text sends no system message at all."""
    messages = prompts.load(prompt_name).render(**fields)
    return [m for m in messages if m["role"] != "system" or m["content"].strip()]


class StepFailed(Exception):
    def __init__(self, step: str, reason: str):
        super().__init__(f"{step}: {reason}")
        self.step = step
        self.reason = reason


def request_seed(run_seed: int, persona_id: str, step: str, attempt: int) -> int:
    """A per-request seed that depends on nothing but the names: reruns send the same requests."""
    digest = hashlib.sha256(f"{run_seed}/{persona_id}/{step}/{attempt}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1


@dataclass
class Asker:
    client: Client
    cfg: SynthConfig
    persona_id: str
    raw: list[dict[str, Any]] = field(default_factory=list)
    copies: list[str] = field(default_factory=list)  # steps whose accepted answer copies its example

    def check_copy(self, step: str, text: str, example: str) -> None:
        """Refuse (or, where the config allows it, count) an answer that is its prompt's example again.

        Call it last in a reader, so that a counted copy is always an accepted answer.
        """
        if echoes(text, example, share=0.8):
            if self.cfg.reject_example_copies:
                raise Unusable("the answer copies the example; write one for this user instead")
            self.copies.append(step)

    async def ask(
        self,
        step: str,
        role: Role,
        messages: Messages | Callable[[int], Messages],
        read: Callable[[str], T],
        max_tokens: int,
        shape: Shape,
    ) -> T:
        """`messages` may be a function of the attempt (1, 2, ...): prompts with examples show another one.

        `shape` is the answer's form; it goes out with the request where the endpoint enforces it, and may
        raise the request's cap to the form's longest answer (a cap below the form's fixed parts).
        """
        attempts = self.cfg.retries + 1
        build = messages if callable(messages) else (lambda attempt: messages)
        endpoint = self.cfg.endpoint(role)
        params = {"max_tokens": max_tokens} | constraint(
            self.client, endpoint, lambda cap: schemas.constrained(shape, cap), max_tokens
        )
        note = ""
        for attempt in range(1, attempts + 1):
            base = build(attempt)
            sent = base
            if note:  # just before the last line, which is the instruction the model answers
                head, _, tail = base[-1]["content"].rpartition("\n")
                content = f"{head}\n\n{note}\n{tail}" if head else f"{note}\n\n{tail}"
                sent = base[:-1] + [{"role": base[-1]["role"], "content": content}]
            temperature = self.cfg.temperature.model_dump()[role]
            retry = {}
            if attempt > 1:
                temperature = max(temperature, self.cfg.retry_temperature)
                retry = self.cfg.retry_params
            try:
                answer = await self.client.chat(
                    endpoint,
                    sent,
                    temperature=temperature,
                    seed=request_seed(self.cfg.seed, self.persona_id, step, attempt),
                    **(retry | params),
                )
            except RequestFailed as e:
                self.raw.append({"step": step, "attempt": attempt, "content": None, "problem": str(e)[:500]})
                raise StepFailed(step, f"request failed ({e.reason}): {e.detail[:300]}") from None
            try:
                system = base[0]["content"] if base[0]["role"] == "system" else ""  # its echo is no answer
                if system and len(words(system)) > 12 and echoes(answer.content, system, share=0.6):
                    raise Unusable("the answer repeats the instructions instead of following them")
                value = read(answer.content)
            except Unusable as e:
                self.raw.append({"step": step, "attempt": attempt, "content": answer.content, "problem": str(e)})
                note = RETRY_TEXT.format(problem=str(e), attempt=attempt + 1)
                continue
            self.raw.append({"step": step, "attempt": attempt, "content": answer.content, "problem": None})
            return value
        last = self.raw[-1]["problem"]
        raise StepFailed(step, f"no usable answer in {attempts} attempt(s); last problem: {last}")


async def all_of(*coroutines: Awaitable[T]) -> list[T]:
    """Results in order; on the first failure the others are cancelled and that failure is raised."""
    try:
        async with asyncio.TaskGroup() as group:
            # coroutines, whatever the annotation says
            tasks: list[asyncio.Task[T]] = [group.create_task(c) for c in coroutines]  # type: ignore[arg-type]
    except BaseExceptionGroup as eg:
        first = eg.exceptions[0]
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
    return [t.result() for t in tasks]
