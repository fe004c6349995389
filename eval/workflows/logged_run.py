"""A run, then, when its config asks (`track:`), its tracker run: what `cupid eval run` and `cupid.evaluate` call.

The export sits on top of both the runner (`eval.benchmark.runner`), which never calls it, and the tracker
(`eval.results.track`), which reads a finished run's files and never runs one; neither imports the other.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rich.console import Console

from cupid.common.aio import blocking
from cupid.eval.benchmark.runner import RunConfig, RunResult, arun
from cupid.eval.results import track


async def arun_and_log(cfg: RunConfig, *, console: Console | None = None, **options: Any) -> RunResult:
    """A run (`runner.arun`), then, with `cfg.track`, its tracker run: checked before anything starts, logged once the
    run's files are written and its servers stopped (the tracker is no request's). `options` go to `runner.arun`."""
    console = console or Console(stderr=True)
    if cfg.track:
        track.require(cfg.track)
    result = await arun(cfg, console=console, **options)
    if cfg.track:

        def make() -> list[Any]:
            return [track.of_run(result.out, records=result.records, summary=result.summary)]

        def say(m: str) -> None:
            console.print(m, highlight=False, markup=False)

        await asyncio.to_thread(track.log_after, make, cfg.track, say)
    return result


def run_and_log(cfg: RunConfig, *, console: Console | None = None, **options: Any) -> RunResult:
    """`arun_and_log` from blocking code (the CLI)."""
    return blocking(lambda: arun_and_log(cfg, console=console, **options))
