"""`cupid synth ...`: synthesize CUPID-style instances from personas with local models."""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console

from cupid.common.config import ConfigError, read_yaml, validate
from cupid.common.errors import EXIT_FAILED, EXIT_USAGE
from cupid.training.synth.config import SynthConfig
from cupid.training.synth.pipeline import run

DEFAULT_CONFIG = "configs/synth/tiny.yaml"

err = Console(stderr=True)


def main(
    config: str = typer.Option(
        DEFAULT_CONFIG, help="synthesis config YAML (configs/synth/*.yaml); options below override it"
    ),
    personas: int | None = typer.Option(None, help="personas 0..N-1 of the seed (raising N extends a run)"),
    seed: int | None = typer.Option(None, help="seed of every random choice"),
    out: str | None = typer.Option(None, help="run directory (resumable)"),
    endpoints: str | None = typer.Option(None, help="endpoints YAML"),
    generator: str | None = typer.Option(None, help="endpoint writing personas, factors, checklists, requests"),
    user_simulator: str | None = typer.Option(None, help="endpoint playing the user"),
    assistant_simulator: str | None = typer.Option(None, help="endpoint playing the assistant"),
    max_turns: int | None = typer.Option(None, help="assistant replies per dialogue at most"),
    parallel: int | None = typer.Option(None, help="personas in flight at once"),
    retries: int | None = typer.Option(None, help="extra attempts per step; raise it to rescue failed personas"),
    cache: str | None = typer.Option(None, help="SQLite request cache file"),
    no_cache: bool = typer.Option(False, "--no-cache", help="neither read nor write the request cache"),
    allow_failures: bool = typer.Option(False, "--allow-failures", help="exit 0 even when personas failed"),
) -> None:
    """Synthesize new CUPID-style instances (personas -> factors -> 13 sessions -> dialogues -> instances); a run
    resumes where it stopped, and its last line counts finished and failed personas."""
    values: dict[str, Any] = dict(read_yaml(config) or {})
    options = {
        "personas": personas,
        "seed": seed,
        "out": out,
        "endpoints": endpoints,
        "generator": generator,
        "user_simulator": user_simulator,
        "assistant_simulator": assistant_simulator,
        "max_turns": max_turns,
        "parallel_personas": parallel,
        "retries": retries,
        "cache": cache,
    }
    values.update({k: v for k, v in options.items() if v is not None})
    if no_cache:  # the command line's spelling of `cache: null`
        values["cache"] = None
    try:
        cfg = validate(SynthConfig, values, config)
        summary = run(cfg, console=err)
    except (ConfigError, ValueError) as e:
        err.print(f"[red]error:[/red] {e}", highlight=False)
        raise typer.Exit(EXIT_USAGE) from None
    for pid, failure in summary["failures"].items():
        err.print(f"[yellow]failed {pid}[/yellow] at {failure['step']}: {failure['reason']}", highlight=False)
    requests = summary["requests"]
    print(  # one plain line, never wrapped: scripts read it
        f"{summary['done']} of {summary['personas']} personas done, {summary['failed']} failed; "
        f"{summary['instances']} instances in {summary['instances_file']}; "
        f"requests {requests['sent']} sent, {requests['cached']} cached; "
        f"{summary['retries']} retries; {summary['seconds']}s"
    )
    if summary["failed"] and not allow_failures:
        raise typer.Exit(EXIT_FAILED)
