"""`cupid eval ...`: run the benchmark against named endpoints, check data files."""

from __future__ import annotations

import inspect
import shutil
from collections.abc import Callable
from typing import Annotated, Any, NoReturn, get_args, get_origin

import typer
from pydantic import TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cupid.common.config import ConfigError, read_yaml, validate
from cupid.common.errors import EXIT_FAILED
from cupid.eval.benchmark import data as cupid_data
from cupid.eval.benchmark.rundir import RunDir
from cupid.eval.benchmark.runner import RunConfig
from cupid.eval.benchmark.runner import dry_run as write_requests
from cupid.eval.benchmark.settings import extra_roles
from cupid.eval.benchmark.summary import Summary, tables
from cupid.eval.benchmark.tasks import TASKS
from cupid.eval.workflows.logged_run import run_and_log  # the run, then its tracker run when `track:` asks

app = typer.Typer(no_args_is_help=True, help="Evaluate models on CUPID.")
console = Console(width=max(120, shutil.get_terminal_size().columns))  # the table stays readable in logs
err = Console(stderr=True, soft_wrap=True)  # errors name files and rows: never wrapped


def _fail(message: str, code: int = 2) -> NoReturn:
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False)  # a message's own brackets are text
    raise typer.Exit(code)


def print_summary(summary: Summary) -> None:
    for spec in tables(summary):
        table = Table(*spec.headers, title=spec.title)
        for row in spec.rows:
            table.add_row(*row)
        console.print(table)
    for line in summary.invalid_rows:
        console.print(f"[yellow]invalid row:[/yellow] {line}", highlight=False)
    for what, n in summary.failures.items():
        console.print(f"[yellow]failed at {what}:[/yellow] {n}", highlight=False)


# RunConfig fields the command line names otherwise (a list is a repeatable option of the singular name),
# and the one it leaves to a config file (a map has no flag form).
_FLAG_NAMES = {"tasks": "task", "settings": "setting", "types": "type"}
_FILE_ONLY = {"serve"}


def _option(name: str, field: FieldInfo) -> inspect.Parameter:
    """A RunConfig field as a `cupid eval run` option: its name, its description as help, None when not
    given (the config file's value or the field's default stands)."""
    flag = "--" + _FLAG_NAMES.get(name, name).replace("_", "-")
    args = get_args(field.annotation)
    annotation: Any
    if field.annotation is bool:
        annotation, default = bool, typer.Option(False, flag, help=field.description)
    elif name == "tasks":  # one option, not repeated: a task or both
        annotation, default = str | None, typer.Option(None, flag, help=field.description)
    elif get_origin(field.annotation) is list:
        annotation, default = list[str] | None, typer.Option(None, flag, help=f"{field.description}; repeatable")
    else:
        annotation = (int | None) if int in (field.annotation, *args) else (str | None)
        default = typer.Option(None, flag, help=field.description)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def _run(config: str | None, dry_run: str | None, allow_failures: bool, no_cache: bool, **options: Any) -> None:
    """Run CUPID: inference (infer -> decompose -> match both ways -> P/R/F1) and/or generation (respond -> judge
    1-10)."""
    values: dict[str, Any] = dict(read_yaml(config) or {}) if config else {}
    if options.get("tasks") is not None:
        options["tasks"] = list(TASKS) if options["tasks"] == "both" else [options["tasks"]]
    given = {k: v for k, v in options.items() if v is not None and v is not False}  # a flag left off is not given
    _check_options(given)
    values.update(given)
    if no_cache:  # the command line's spelling of `cache: null`
        values["cache"] = None
    try:
        cfg = validate(RunConfig, values, config or "command-line options")
        if dry_run:
            write_requests(cfg, dry_run, console=err)
            return
        summary = run_and_log(cfg, console=err).summary
    except (ConfigError, cupid_data.DataError) as e:
        _fail(str(e))
    except KeyboardInterrupt:
        kept = len(RunDir(cfg.out).records()) if cfg.out else 0
        where = f" in {cfg.out}; the same command resumes from them" if cfg.out else " (no --out: nothing is kept)"
        err.print(f"interrupted: {kept} unit(s) kept{where}", highlight=False)
        raise typer.Exit(130) from None
    print_summary(summary)
    problems = summary.n_failed + summary.n_invalid_rows
    print(  # one plain line, never wrapped: scripts read it
        f"{summary.n_failed} failed, {summary.n_invalid_rows} invalid rows, "
        f"{summary.n_scored} scored of {summary.n_runs}; results in {cfg.out}"
    )
    if problems and not allow_failures:
        raise typer.Exit(EXIT_FAILED)


def _check_options(given: dict[str, Any]) -> None:
    """Each option the command line gave, checked as its RunConfig field checks it, before anything runs: a bad one is
    a usage error naming the option, never blamed on the config file."""
    for name, value in given.items():
        field = RunConfig.model_fields[name]
        try:
            checked = Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation
            TypeAdapter(checked).validate_python(value)
        except ValidationError as e:
            flag = "--" + _FLAG_NAMES.get(name, name).replace("_", "-")
            problem = e.errors()[0]
            raise typer.BadParameter(f"{problem['input']!r}: {problem['msg']}", param_hint=f"'{flag}'") from None


def _run_command() -> Callable[..., None]:
    """`_run` with one option per RunConfig field, derived from the field (as TRL derives its CLI from its
    config dataclasses): the options cannot drift from the config they fill."""
    own = [
        inspect.Parameter(
            "config",
            inspect.Parameter.KEYWORD_ONLY,
            annotation=str | None,
            default=typer.Option(None, help="run config YAML (configs/eval/*.yaml); options below override it"),
        ),
        inspect.Parameter(
            "dry_run",
            inspect.Parameter.KEYWORD_ONLY,
            annotation=str | None,
            default=typer.Option(
                None,
                "--dry-run",
                help="write the candidate requests as an OpenAI batch JSONL to this file and send nothing",
            ),
        ),
        inspect.Parameter(
            "allow_failures",
            inspect.Parameter.KEYWORD_ONLY,
            annotation=bool,
            default=typer.Option(False, "--allow-failures", help="exit 0 even when instances failed"),
        ),
        inspect.Parameter(
            "no_cache",
            inspect.Parameter.KEYWORD_ONLY,
            annotation=bool,
            default=typer.Option(False, "--no-cache", help="neither read nor write a request cache (`cache: null`)"),
        ),
    ]
    fields = [_option(name, field) for name, field in RunConfig.model_fields.items() if name not in _FILE_ONLY]
    params = own[:1] + fields + own[1:]

    def command(**kwargs: Any) -> None:
        _run(**kwargs)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = _run.__doc__
    return command


run = app.command("run")(_run_command())


@app.command("check-data")
def check_data(source: str = typer.Argument("sample", help="'sample', a local path or a Hub id")) -> None:
    """Validate a CUPID-format data source and list every bad row."""
    try:
        dataset = cupid_data.load(source)
    except cupid_data.DataError as e:
        _fail(str(e))
    counts = {t: sum(i.instance_type == t for i in dataset.instances) for t in cupid_data.INSTANCE_TYPES}
    console.print(
        f"{dataset.source}: {len(dataset.instances)} valid instances {counts}, {len(dataset.bad_rows)} bad rows"
    )
    for bad in dataset.bad_rows:
        console.print(f"[red]bad row:[/red] {escape(str(bad))}", highlight=False)
    if dataset.bad_rows:
        raise typer.Exit(EXIT_FAILED)


@app.command("list")
def list_tasks() -> None:
    """The tasks, the settings each runs in, their figures (the headline first), and every role a run binds: the
    judges that score each task, and the roles a setting adds (the summary setting's summarizer)."""
    table = Table("task", "settings", "figures (headline first)", "roles", title="CUPID tasks")
    for spec in TASKS.values():
        figures = [*spec.headline, *(m for m in spec.metrics if m not in spec.headline)]
        added = [f"{role} ({setting})" for setting in spec.settings for role in extra_roles([setting])]
        table.add_row(spec.name, ", ".join(spec.settings), ", ".join(figures), ", ".join([*spec.roles, *added]))
    console.print(table)
