"""`cupid eval ...`: run the benchmark against named endpoints, check data files."""

from __future__ import annotations

import shutil
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from cupid.eval import data as cupid_data
from cupid.eval.runner import RunConfig, run as run_eval
from cupid.eval.summary import tables
from cupid.serving.config import ConfigError, read_yaml, validate

app = typer.Typer(no_args_is_help=True, help="Evaluate models on CUPID.")
console = Console(width=max(120, shutil.get_terminal_size().columns))  # the table stays readable in logs
err = Console(stderr=True, soft_wrap=True)  # errors name files and rows: never wrapped


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(code)


def print_summary(summary: dict[str, Any]) -> None:
    for spec in tables(summary):
        table = Table(*spec.headers, title=spec.title)
        for row in spec.rows:
            table.add_row(*row)
        console.print(table)
    for line in summary["invalid_rows"]:
        console.print(f"[yellow]invalid row:[/yellow] {line}", highlight=False)
    for what, n in summary["failures"].items():
        console.print(f"[yellow]failed at {what}:[/yellow] {n}", highlight=False)


@app.command()
def run(
    config: Optional[str] = typer.Option(None, help="run config YAML (configs/eval/*.yaml); options below override it"),
    data: Optional[str] = typer.Option(None, help="'sample', a local .jsonl/.json/.parquet file or directory, or a Hub id (kixlab/CUPID)"),
    endpoints: Optional[str] = typer.Option(None, help="endpoints YAML"),
    candidate: Optional[str] = typer.Option(None, help="endpoint of the model under evaluation"),
    decomposer: Optional[str] = typer.Option(None, help="endpoint that turns the inferred preference into a checklist"),
    matcher: Optional[str] = typer.Option(None, help="endpoint that labels checklist items against preferences"),
    judge: Optional[str] = typer.Option(None, help="endpoint that scores generation responses 1-10"),
    summarizer: Optional[str] = typer.Option(None, help="endpoint that summarizes sessions (summary setting)"),
    reference: Optional[str] = typer.Option(None, help="endpoint (e.g. gpt-4o) that re-scores the same answers as decomposer, matcher and judge"),
    task: Optional[str] = typer.Option(None, help="inference, generation or both"),
    setting: Optional[list[str]] = typer.Option(None, help="standard, oracle, oracle-preference (generation) or summary; repeatable"),
    types: Optional[list[str]] = typer.Option(None, "--type", help="only these instance types; repeatable"),
    limit: Optional[int] = typer.Option(None, help="only the first N instances"),
    concurrency: Optional[int] = typer.Option(None, help="requests in flight per endpoint (overrides the endpoints file)"),
    executor: Optional[str] = typer.Option(None, help="http (running servers), vllm-offline (vLLM in this process, GPU, no server) or transformers-offline (CPU)"),
    out: Optional[str] = typer.Option(None, help="run directory (resumable)"),
    cache: Optional[str] = typer.Option(None, help="SQLite request cache file"),
    no_cache: bool = typer.Option(False, "--no-cache", help="neither read nor write the request cache"),
    refresh: bool = typer.Option(False, "--refresh", help="send every request again and overwrite the cache"),
    dry_run: Optional[str] = typer.Option(None, "--dry-run", help="write the candidate requests as an OpenAI batch JSONL to this file and send nothing"),
    allow_failures: bool = typer.Option(False, "--allow-failures", help="exit 0 even when instances failed"),
) -> None:
    """Run CUPID: inference (infer -> decompose -> match both ways -> P/R/F1) and/or generation (respond -> judge 1-10)."""
    values: dict[str, Any] = dict(read_yaml(config) or {}) if config else {}
    options = {
        "data": data, "endpoints": endpoints, "candidate": candidate, "decomposer": decomposer, "matcher": matcher,
        "judge": judge, "summarizer": summarizer, "reference": reference, "settings": setting, "types": types,
        "limit": limit, "concurrency": concurrency, "executor": executor, "out": out, "cache": cache,
    }  # fmt: skip
    if task is not None:
        options["tasks"] = ["inference", "generation"] if task == "both" else [task]
    values.update({k: v for k, v in options.items() if v})
    values.update({k: True for k, v in {"no_cache": no_cache, "refresh": refresh}.items() if v})
    try:
        cfg = validate(RunConfig, values, config or "command-line options")
        summary = run_eval(cfg, dry_run=dry_run, console=err)
    except (ConfigError, cupid_data.DataError) as e:
        _fail(str(e))
    if dry_run:
        return
    print_summary(summary)
    problems = summary["n_failed"] + summary["n_invalid_rows"]
    print(  # one plain line, never wrapped: scripts read it
        f"{summary['n_failed']} failed, {summary['n_invalid_rows']} invalid rows, "
        f"{summary['n_scored']} scored of {summary['n_runs']}; results in {cfg.out}"
    )
    if problems and not allow_failures:
        raise typer.Exit(1)


@app.command("check-data")
def check_data(source: str = typer.Argument("sample", help="'sample', a local path or a Hub id")) -> None:
    """Validate a CUPID-format data source and list every bad row."""
    try:
        dataset = cupid_data.load(source)
    except cupid_data.DataError as e:
        _fail(str(e))
    counts = {t: sum(i.instance_type == t for i in dataset.instances) for t in cupid_data.INSTANCE_TYPES}
    console.print(f"{dataset.source}: {len(dataset.instances)} valid instances {counts}, {len(dataset.bad_rows)} bad rows")
    for bad in dataset.bad_rows:
        console.print(f"[red]bad row:[/red] {bad}", highlight=False)
    if dataset.bad_rows:
        raise typer.Exit(1)
