"""The demo, from any directory (`cupid demo`, `make demo`): the tiny model prepared under the state directory and
served by vLLM's CPU build (the `tiny` profile), both tasks run on the bundled sample (`configs/eval/tiny.yaml`), and
the server stopped again if the demo started it. A `tiny` server already answering is used as it is and left running.
Everything it writes lies under the state directory (the model, the server's log, the request cache) and `out`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from cupid.common.config import read_yaml, validate
from cupid.eval.benchmark.runner import RunConfig, RunResult
from cupid.eval.benchmark.runner import dry_run as write_requests
from cupid.eval.workflows.logged_run import run_and_log
from cupid.serving.servers import lifecycle, profiles, tiny_model

CONFIG = "configs/eval/tiny.yaml"
PROFILE = "tiny"
OUT = "runs/demo"


@dataclass
class Demo:
    """What the demo did: its run (None for a dry run), where it wrote it, and whether it started the server."""

    out: Path
    result: RunResult | None
    started_server: bool
    requests: Path | None = None  # a dry run's candidate requests (OpenAI batch JSONL)


def demo_config(out: str | Path = OUT, limit: int | None = None) -> RunConfig:
    """The demo's run: the shipped tiny run config, written to `out`."""
    values = dict(read_yaml(CONFIG) or {})
    values["out"] = str(out)
    if limit is not None:
        values["limit"] = limit
    return validate(RunConfig, values, CONFIG)


def _running() -> bool:
    """The tiny profile served by `cupid serve up` and answering."""
    return any(s.name == PROFILE and s.healthy for s in lifecycle.status())


def run_demo(
    out: str | Path = OUT,
    *,
    limit: int | None = None,
    port: int | None = None,
    dry_run: bool = False,
    console: Console | None = None,
) -> Demo:
    """Prepare, serve, run, stop (see the module). `port`: where the server it starts listens (the profile's, 8011,
    by default); the run's endpoints follow the server wherever it runs. `dry_run`: check the profile and the run
    config, write the candidate requests to `<out>/requests.jsonl`, prepare and start nothing."""
    console = console or Console(stderr=True)
    cfg = demo_config(out, limit)
    profile = profiles.load(PROFILE, cfg.profiles)
    if port is not None:
        profile = profiles.override(profile, {"port": port}, "--port")
    if dry_run:
        requests = Path(out) / "requests.jsonl"
        write_requests(cfg, str(requests), console=console)
        console.print(
            f"demo (dry run): would prepare {profile.model_path()}, serve profile '{PROFILE}' on "
            f":{profile.port} unless it runs, run {CONFIG} into {out}",
            highlight=False,
        )
        return Demo(Path(out), None, False, requests)
    console.print(f"demo: the tiny model in {tiny_model.ensure()}", highlight=False)
    started = not _running()
    if started:
        console.print(
            f"demo: starting profile '{PROFILE}' on :{profile.port} (vLLM starts slowly on CPU)", highlight=False
        )
        profile.check_local_files()
        lifecycle.up(profile, tied=True)  # stopped below, and with this process however it ends
    try:
        result = run_and_log(cfg, console=console)
    finally:
        if started:
            lifecycle.down(PROFILE)
    return Demo(Path(out), result, started)
