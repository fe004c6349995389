"""How a task's chain of stages runs and fails: the roles of a run, a stage's request, its parse, its error.

A stage that fails ends its chain with an error that names the stage, the reason and the raw
answer; the instance is then counted as failed and kept out of every average.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from cupid.eval.benchmark.records import Scoring, StageError
from cupid.matcher import parse
from cupid.serving.client import Client, RequestFailed


@dataclass(frozen=True)
class Roles:
    """Endpoint names; a role a run does not need stays None."""

    candidate: str
    decomposer: str | None = None
    matcher: str | None = None
    judge: str | None = None
    summarizer: str | None = None

    def bound(self) -> dict[str, str]:
        return {role: name for role, name in vars(self).items() if name is not None}


class StageFailed(Exception):
    def __init__(self, stage: str, reason: str, detail: str, raw: str | None = None):
        super().__init__(f"{stage}: {reason}: {detail}")
        self.error = StageError(stage=stage, reason=reason, detail=detail, raw=raw)


async def stage_by_stage(stages: Callable[[Scoring], Awaitable[None]]) -> Scoring:
    """A scorer's result: `stages` fills a fresh scoring one stage at a time, so a stage that fails leaves
    everything before it (the parsed preference, the judges' raw answers) beside its error."""
    scoring = Scoring()
    try:
        await stages(scoring)
    except StageFailed as e:
        scoring.error = e.error
        return scoring
    scoring.status = "scored"
    return scoring


def constraint(
    client: Client, endpoint: str, build: Callable[[int | None], dict[str, Any]], max_tokens: int | None = None
) -> dict[str, Any]:
    """An answer-format constraint (`matcher.schemas`), where the endpoint's engine enforces one.

    `build` gets the answer cap the request goes out with: its own `max_tokens` where it sets one (each
    synthesis step does), else the endpoint's; the format is sized to fit it.
    """
    settings = client.endpoints[endpoint]
    return build(max_tokens if max_tokens is not None else settings.max_tokens) if settings.structured_output else {}


# Each judge role's answer cap where its endpoint sets no `max_tokens`: a judge's answer is a checklist, a list of
# labels, a score or a session's summary, well within it; without one, a small model that never stops ran for minutes
# a unit on a CPU (vLLM's own cap is the model's whole window).
JUDGE_MAX_TOKENS = {"decomposer": 1024, "matcher": 1024, "judge": 1024, "summarizer": 1024}


def judge_params(
    client: Client, role: str, endpoint: str, build: Callable[[int | None], dict[str, Any]]
) -> dict[str, Any]:
    """A judge's request fields: its answer cap (the endpoint's, else its role's) and its answer format where the
    endpoint enforces one (`constraint`), sized to that cap."""
    cap = client.endpoints[endpoint].max_tokens or JUDGE_MAX_TOKENS[role]
    return {"max_tokens": cap, **constraint(client, endpoint, build, cap)}


async def ask(client: Client, stage: str, endpoint: str, messages: list[dict[str, str]], **params: Any) -> str:
    try:
        return (await client.chat(endpoint, messages, **params)).content
    except RequestFailed as e:
        raise StageFailed(stage, e.reason, e.detail) from None


def parsed(stage: str, parser: Callable[..., Any], answer: str, *args: Any) -> Any:
    try:
        return parser(answer, *args)
    except parse.ParseError as e:
        raise StageFailed(stage, "parse_error", e.message, e.raw) from None
