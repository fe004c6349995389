"""The log of the user's past a candidate is shown in each setting (`settings`): the prior sessions as they are, or
each session's summary, asked of the summarizer.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from cupid.eval.benchmark.data import Instance
from cupid.eval.benchmark.settings import SETTING_SPECS
from cupid.eval.benchmark.stages import StageFailed, ask, judge_params, parsed
from cupid.matcher import parse, prompts, schemas
from cupid.serving.client import Client


def relevant_sessions(instance: Instance) -> list[int]:
    """0-based positions of the prior sessions that hold the current preference (the oracle's sessions)."""
    return [
        i
        for i, s in enumerate(instance.prior_interactions)
        if s.contextual_preference == instance.current_contextual_preference
    ]


def plain_log(instance: Instance, setting: str) -> str:
    """The log of a setting that needs no model call to build (one built from answers is `History.log`'s)."""
    return prompts.format_interaction_log(instance.sessions(setting))


@dataclass(frozen=True)
class History:
    client: Client
    summarizer: str | None = None

    async def log(self, instance: Instance, setting: str) -> str:
        if SETTING_SPECS[setting].built_by is None:
            return plain_log(instance, setting)
        sessions = instance.sessions(setting)
        outcomes = await asyncio.gather(*(self.summary(s) for s in sessions), return_exceptions=True)
        for outcome in outcomes:  # all finished first: the summaries that worked are cached for the resume
            if isinstance(outcome, BaseException):
                raise outcome
        return prompts.format_summary_log(outcomes)  # type: ignore[arg-type]  # every failure was raised above

    async def summary(self, session: dict) -> dict[str, list[str]]:
        """One request per session: identical sessions across instances cost one call (cache, in-flight dedup)."""
        if self.summarizer is None:
            raise StageFailed("summarize", "no_summarizer", "the summary setting needs a summarizer endpoint")
        fmt = judge_params(self.client, "summarizer", self.summarizer, schemas.summarizer)
        answer = await ask(self.client, "summarize", self.summarizer, prompts.summarizer(session), **fmt)
        return parsed("summarize", parse.session_summary, answer)
