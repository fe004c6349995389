"""`cupid nightly` (`make nightly`): run a suite of candidate models, write a leaderboard with each
model's change since the previous nightly, and fail loudly on a regression or on failures.

Each night's runs go to `<out>/<date>/<model>/`, through the shared request cache, so an unchanged
model costs nothing the second night. Every candidate is checked and served on its own: one that fails a
check or does not start is a `DID NOT RUN` row with its reason and the others run. Only what every
candidate needs (the nightly file, the judges, the cache) stops a night before it starts, and that night's
leaderboard then says why. A night holds its directory: cron starting it twice runs it once.

Tonight is compared with the candidate's previous night and with its baseline (its own first night, whenever it joined,
or the later night `baseline:` names; kept across nights it skips, read from its newest entry), each on the units both
ran and decided as `cupid compare`'s gate decides (`eval.results.compare`: paired, personas resampled, the candidate's
own failures against it, a verdict only on the same evaluation; `eval.results.regressions` reads the finished runs): a
drift too slow for one night to show is seen against the baseline. REGRESSION is a task's headline figure (inference:
micro F1, generation: the mean judge score, in the headline setting; each persona's own, averaged) that dropped beyond
`margin` at the gate's level (2.5% / `horizon` a night: a false alarm tonight at most that likely, whatever the law of
the changes), Holm across every headline test of the night (candidates x tasks x {previous, baseline}), or a candidate
that left more
than 1% more units unanswered. A comparison that is not the same evaluation (judges, prompts or data changed; units
missing) or too small is NO VERDICT, never ok; a baseline whose setup changed, or whose run is gone, is replaced by
tonight, once tonight's regressions are decided and only if it was not flagged and its test since last night has a
verdict. Exit status, bits: 1 failures (failed instances or a run or the suite that could not start), 4 a regression, 8
no verdict (2 stays a usage or configuration error)."""

from __future__ import annotations

import threading
import traceback
from datetime import date as Date
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from rich.console import Console
from rich.markup import escape

from cupid.common.config import ConfigError, Tracker, describe, load_model
from cupid.common.errors import ServeError, failure_line
from cupid.common.files import hold
from cupid.eval.benchmark.rundir import Run, RunDir
from cupid.eval.benchmark.runner import RunConfig
from cupid.eval.benchmark.runner import run as run_eval
from cupid.eval.benchmark.settings import SETTINGS
from cupid.eval.benchmark.tasks import TASKS
from cupid.eval.results import track as tracking
from cupid.eval.results.compare import HEADLINE_SETTING, margin_question
from cupid.eval.results.leaderboard import Entry, Leaderboard, assemble, run_dir_of, write_leaderboard
from cupid.eval.results.regressions import (
    NIGHT_DATE,
    Changes,
    baseline_of,
    changes_of,
    failures_by_setting,
    flag_regressions,
    latest_entries,
    metrics,
    previous_night,
)
from cupid.eval.results.track import require as require_tracker
from cupid.serving.cache import open_cache
from cupid.serving.fleet.gpu_memory import Gpu
from cupid.serving.fleet.on_demand import ServedModel
from cupid.serving.fleet.run_servers import RunServers, plan_servers


class NightlyConfig(BaseModel):
    """`configs/eval/nightly.yaml`: the candidates (endpoints, or models the night serves) and one run setup."""

    model_config = ConfigDict(extra="forbid")

    models: list[str | ServedModel] = Field(
        min_length=1,
        description="candidates: endpoint names, or models to serve ({name, model, profile, adapter, ...})",
    )
    out: str = Field("runs/nightly", description="root of the dated nightly directories")
    run: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "RunConfig fields for every model, except candidate and out; its `serve:` judges are served once a night"
        ),
    )
    report: bool = Field(True, description="also write the HTML report of the night's runs")
    candidate_port: int = Field(
        8100, ge=1, le=65535, description="served candidates listen from this port up, one port per slot"
    )
    track: Tracker | None = Field(
        None, description="log each candidate's run, with the night's date and its flag, to mlflow or wandb"
    )
    baseline: str | None = Field(
        None,
        pattern=r"^\d{4}-\d{2}-\d{2}$",
        description="the night (YYYY-MM-DD) every candidate is compared with "
        "besides the previous one; default: each candidate's first night (set again when its setup changes)",
    )
    headline_setting: str = Field(HEADLINE_SETTING, description="the setting whose headline figures are tested")
    margin: float = Field(
        0.0,
        ge=0,
        description="the drop a headline may show before it is a regression, in points of its shown figure (F1 "
        "points, judge-score points; 2 is 2 points, not a fraction), as `cupid compare --margin`",
    )
    horizon: int = Field(
        1,
        ge=1,
        description="nights the gate's level covers together: each night's family is held at 2.5%/horizon, so that "
        "a false REGRESSION in any of `horizon` nights is at most 2.5% likely (1: 2.5% a night, a rate)",
    )

    @field_validator("headline_setting")
    @classmethod
    def _a_setting(cls, value: str) -> str:
        if value not in SETTINGS:
            raise ValueError(f"{value!r} is no setting (one of: {', '.join(SETTINGS)})")
        return value

    def names(self) -> list[str]:
        return [m.name if isinstance(m, ServedModel) else m for m in self.models]


def run_configs(cfg: NightlyConfig, night_dir: Path, where: str) -> dict[str, RunConfig]:
    """One validated RunConfig per model, all checked before anything runs."""
    if clash := sorted({"candidate", "out"} & cfg.run.keys()):
        raise ConfigError(f"{where}: run.{clash[0]} is set per model by the nightly; remove it")
    if "track" in cfg.run:
        raise ConfigError(
            f"{where}: run.track: set `track:` at the top of the file (the night logs each candidate with its flag)"
        )
    names = cfg.names()
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise ConfigError(f"{where}: models lists '{twice[0]}' twice")
    configs = {}
    for name, model in zip(names, cfg.models, strict=True):
        try:
            configs[name] = RunConfig(**cfg.run, candidate=model, out=str(run_dir_of(night_dir, name)))
        except ValidationError as e:
            raise ConfigError(describe(e, f"{where}: run (for model {name})")) from None
    return configs


# ---------------------------------------------------------------- one night


def primary_metric(cfg: RunConfig) -> str:
    """The leaderboard's ranking column: the first declared task's primary metric (inference: micro F1, the
    published aggregate) in its first setting."""
    task = next(spec for name, spec in TASKS.items() if cfg.units_of(name))
    return f"{task.name}/{cfg.units_of(task.name)[0]}/{task.headline[0]}"


def check_candidates(cfg: NightlyConfig, configs: dict[str, RunConfig]) -> dict[str, str]:
    """Each served candidate checked on its own (its profile, its adapter, its local weights): name -> why it cannot
    run tonight. The weights are checked here, not only when its server starts, so that a dry run says so too."""
    refused = {}
    for model in cfg.models:
        if isinstance(model, ServedModel):
            try:
                model.to_profile(configs[model.name].profiles).check_local_files(f"candidate '{model.name}'")
            except (ConfigError, ServeError) as e:
                refused[model.name] = str(e)
    return refused


def not_run(name: str, reason: str, run_cfg: RunConfig | None = None) -> Entry:
    """The leaderboard entry of a candidate that did not run: its reason, no scores (never zeros)."""
    return Entry(
        model=name,
        run_dir=run_cfg.out if run_cfg else None,
        primary=primary_metric(run_cfg) if run_cfg else "-",
        error=reason,
        status="error",
    )


def check_cache(configs: dict[str, RunConfig]) -> None:
    """The request cache every run shares opens (or is refused, by name) before the night starts anything."""
    first = next(iter(configs.values()))
    if (cache := open_cache(first.cache)) is not None:
        cache.close()


def plan_night(
    cfg: NightlyConfig, configs: dict[str, RunConfig], gpus: list[Gpu] | None = None, console: Console | None = None
) -> RunServers:
    """The night's servers: its judges (`run.serve`) once, its served candidates (those in `configs`) in slots;
    checked, not started."""
    first = next(iter(configs.values()))
    served = [m for m in cfg.models if isinstance(m, ServedModel) and m.name in configs]
    say = (lambda message: console.print(f"nightly: {message}", highlight=False)) if console else None
    return plan_servers(first.serve, served, gpus, first_port=cfg.candidate_port, directory=first.profiles, say=say)


def run_one(name: str, run_cfg: RunConfig, run_servers: RunServers, console: Console) -> tuple[Entry, Run]:
    """One candidate's run, read back once (what it computed, or what a run cut short left on disk), and its
    leaderboard entry as the run alone fills it; its server (if the night serves it) is stopped after. Its
    comparisons come after the night (`changes_of`, `flag_regressions`), on the same `Run`."""
    console.rule(f"nightly: {name}")
    assert run_cfg.out is not None, "a night sets every run's directory"
    primary = primary_metric(run_cfg)
    server = run_servers.server_of(name)
    served = server.line() if server is not None else None
    result, error, server_error = None, None, None
    try:
        result = run_eval(run_cfg, console=console, run_servers=run_servers)
    except Exception as e:  # noqa: BLE001 (one model's broken setup must not cost the others their night)
        error = f"{type(e).__name__}: {e}"
        console.print(f"[red]{escape(name)} did not run:[/red] {escape(error)}", highlight=False)
        if not isinstance(e, ConfigError):
            console.print(traceback.format_exc(), markup=False, highlight=False)
    finally:
        if server is not None:
            server.stop()
    if server is not None and server.error is not None:  # every unit failed for this reason: say it once
        error = ("server did not start: " if server.failed_to_start else "") + failure_line(server.error)
        server_error = str(server.error)  # with the log's last lines
        console.print(f"{name}: {server.error}", style="red", highlight=False, markup=False)
    out = RunDir(run_cfg.out)
    records = result.records if result is not None else list(out.records().values())
    run = Run(out.path, out.identity(), result.summary if result is not None else out.summary(), records)
    n_failed = sum(not r.scored for r in records)
    entry = Entry(
        model=name,
        run_dir=run_cfg.out,
        primary=primary,
        error=error,
        status="error" if error else "failed" if n_failed else "ok",
        # the night did not serve it if it did not start (or the cache answered everything)
        served=served if server is not None and server.started else None,
        server_error=server_error,
        identity=run.identity,
        metrics=metrics(records),
        n_scored=sum(r.scored for r in records),
        # DID NOT RUN: its reason stands for its units, none is counted as failed
        n_failed=0 if error else n_failed,
        failures={} if error else failures_by_setting(records),
        requests=result.summary.requests if result is not None else None,
        wall_s=result.summary.wall_s if result is not None else None,
    )
    return entry, run


def run_slots(slots: list[list[str]], run: Any, night_dir: Path, console: Console) -> list[Entry]:
    """Slots side by side, each in its own thread with its console in `<night>/<slot>.log`; a slot's
    candidates one after another. Daemon threads, joined in short waits: Ctrl-C still reaches this thread."""
    if len(slots) <= 1:
        return [run(name, console) for slot in slots for name in slot]
    entries: list[Entry] = []

    def work(number: int, names: list[str]) -> None:
        night_dir.mkdir(parents=True, exist_ok=True)
        with open(night_dir / f"slot-{number}.log", "w", encoding="utf-8") as log:
            slot_console = Console(file=log, width=120, soft_wrap=True)
            for name in names:
                entries.append(run(name, slot_console))
                console.print(f"nightly: {name} done (slot {number})", highlight=False)

    threads = [threading.Thread(target=work, args=(n, names), daemon=True) for n, names in enumerate(slots, start=1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.5)
    return entries


def run_nightly(
    config_path: str | Path,
    night: str | None = None,
    console: Console | None = None,
    dry_run: bool = False,
    gpus: list[Gpu] | None = None,
    track: Tracker | None = None,
) -> tuple[Leaderboard, int]:
    """Run every model of the suite for one night; return the leaderboard and the exit status. `dry_run`:
    print and check the plan only (on `gpus`, when given, instead of the visible ones): a leaderboard of no model
    with the plan, and exit status 0; a candidate refused is one that did not run. `track` (or the file's
    `track:`) logs each candidate to that tracker once the leaderboard is written."""
    console = console or Console(stderr=True, soft_wrap=True)  # plan lines and errors name paths: never wrapped
    cfg = load_model(NightlyConfig, config_path)  # unreadable: there is no night directory to write to
    if track := track or cfg.track:
        require_tracker(track)
    night = night or Date.today().isoformat()
    if not NIGHT_DATE.match(night):
        raise ConfigError(f"--date {night!r}: expected YYYY-MM-DD")
    root = Path(cfg.out)
    night_dir = root / night
    if dry_run:
        configs = run_configs(cfg, night_dir, str(config_path))
        refused = check_candidates(cfg, configs)
        for name, reason in refused.items():
            console.print(f"nightly: {name} would not run: {reason}", highlight=False)
        run_servers = _plan(cfg, {n: c for n, c in configs.items() if n not in refused}, gpus, console, config_path)
        planned = Leaderboard(date=night, dir=str(night_dir), config=str(config_path), plan=run_servers.lines())
        planned.models = [not_run(name, reason, configs[name]) for name, reason in refused.items()]
        return planned, 0
    with hold(
        night_dir, lambda m: console.print(f"nightly: {m}", highlight=False)
    ):  # cron starting it twice runs it once
        try:  # what every candidate needs: a fault here is the whole night's, written down as such
            configs = run_configs(cfg, night_dir, str(config_path))
            check_cache(configs)
            refused = check_candidates(cfg, configs)
            run_servers = _plan(cfg, {n: c for n, c in configs.items() if n not in refused}, gpus, console, config_path)
        except ConfigError as e:
            board = _board(
                night,
                night_dir,
                None,
                config_path,
                [not_run(n, f"the night did not start: {e}") for n in cfg.names()],
                error=str(e),
            )
            write_leaderboard(board, night_dir, root)
            if track:
                log_night(board, track, console)
            raise
        board, tonight = _run_night(cfg, configs, refused, run_servers, night, night_dir, root, config_path, console)
        if track:
            log_night(board, track, console, tonight)
        return board, board.exit_code


def log_night(board: Leaderboard, track: Tracker, console: Console, runs: dict[str, Run] | None = None) -> None:
    """Each candidate of the night into the tracker, after the leaderboard (`runs`: tonight's, as they were read):
    its failures are warnings."""
    tracking.log_after(
        lambda: tracking.of_night(board, runs),
        track,
        lambda m: console.print(f"nightly: {m}", highlight=False, markup=False),
    )


def _plan(
    cfg: NightlyConfig, configs: dict[str, RunConfig], gpus: list[Gpu] | None, console: Console, config_path: str | Path
) -> RunServers:
    try:
        run_servers = plan_night(cfg, configs, gpus, console)
    except ServeError as e:
        raise ConfigError(f"{config_path}: {e}") from None
    for line in run_servers.lines():
        console.print(line, highlight=False)
    return run_servers


def _run_night(
    cfg: NightlyConfig,
    configs: dict[str, RunConfig],
    refused: dict[str, str],
    run_servers: RunServers,
    night: str,
    night_dir: Path,
    root: Path,
    config_path: str | Path,
    console: Console,
) -> tuple[Leaderboard, dict[str, Run]]:
    """The night once its servers are planned: its runs, their comparisons, the leaderboard and the report; returned
    with each candidate's run as it was read (once)."""
    if question := margin_question(cfg.margin):
        console.print(f"nightly: did you mean a fraction? margin: {question}", highlight=False)
    prev_dir = previous_night(root, night)
    previous = {e.model: e for e in Leaderboard.read(prev_dir / "leaderboard.json").models} if prev_dir else {}

    tonight: dict[str, Run] = {}  # each candidate's run as it computed it: read once, compared and reported

    def run(name: str, out: Console) -> Entry:
        entry, tonight[name] = run_one(name, configs[name], run_servers, out)
        return entry

    outcomes = []  # each candidate's entry as its run (or its refusal) alone fills it
    for name, reason in refused.items():
        console.print(f"[red]{escape(name)} did not run:[/red] {escape(reason)}", highlight=False)
        outcomes.append(not_run(name, reason, configs[name]))
    try:  # endpoints and riders first (they need only the judges), then the served candidates slot by slot
        outcomes += [
            run(name, console) for name in configs if name not in run_servers.candidate_servers and name not in refused
        ]
        outcomes += run_slots(run_servers.slot_names, run, night_dir, console)
    finally:  # also on Ctrl-C and errors: nothing the night started outlives it
        run_servers.stop_all()  # each says what it stopped

    latest = latest_entries(root, night, [e.model for e in outcomes])
    last_night = prev_dir.name if prev_dir else None

    def changes(entry: Entry) -> Changes:
        baseline = baseline_of(cfg.baseline, latest.get(entry.model))
        if entry.status == "error":  # did not run: nothing to compare, its baseline kept
            return Changes(baseline=baseline)
        return changes_of(
            entry.model,
            entry.metrics,
            tonight.get(entry.model),
            previous.get(entry.model),
            baseline,
            night,
            root,
            cfg.headline_setting,
            last_night=last_night,
            margin=cfg.margin,
            first=entry.model not in latest,
        )

    changed = [changes(entry) for entry in outcomes]
    decisions, level = flag_regressions(changed, night, cfg.horizon)
    entries = [
        entry.model_copy(update=c.entry_fields() | d.entry_fields())
        for entry, c, d in zip(outcomes, changed, decisions, strict=True)
    ]
    board = _board(night, night_dir, prev_dir, config_path, entries, run_servers=run_servers, family_level=level)
    write_leaderboard(board, night_dir, root)
    if cfg.report:
        from cupid.eval.results.report import build

        ran = [tonight[name] for name in configs if name in tonight and tonight[name].records]
        if ran:
            board.report = str(build(ran, night_dir / "report"))
    return board, tonight


def _board(
    night: str,
    night_dir: Path,
    prev_dir: Path | None,
    config_path: str | Path,
    entries: list[Entry],
    run_servers: RunServers | None = None,
    error: str | None = None,
    family_level: str = "",
) -> Leaderboard:
    """The night's leaderboard, with what its servers did."""
    servers = run_servers.servers if run_servers else []
    return assemble(
        night,
        night_dir,
        prev_dir,
        config_path,
        entries,
        error=error,
        plan=run_servers.lines() if run_servers else [],
        started=sorted({s.name for s in servers if s.started}),
        stopped_answering={s.name: s.deaths for s in servers if s.deaths},
        family_level=family_level,
    )
