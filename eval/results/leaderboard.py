"""A night's leaderboard as `leaderboard.json` holds it: its candidates' entries, and the flag each gets.

Its own module, below both the nightly that writes it (`eval.workflows.nightly`) and the tracker that logs it
(`eval.results.track`), so that neither imports the other.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from cupid.common.config import ConfigError
from cupid.common.errors import EXIT_FAILED, EXIT_NO_VERDICT, EXIT_REGRESSION
from cupid.common.files import write_atomic
from cupid.eval.benchmark.rundir import RunIdentity
from cupid.eval.benchmark.stats import MIN_PERSONAS, N_RESAMPLES, Interval
from cupid.eval.benchmark.summary import Requests
from cupid.eval.benchmark.tasks import TASKS
from cupid.eval.benchmark.taskspec import TaskSpec
from cupid.eval.results.compare import Row

FIRST_NIGHT = "the candidate's first night"  # why a night became a candidate's baseline: it never ran before
Status = Literal["ok", "failed", "error"]  # scored throughout; with failed units; did not run


class Entry(BaseModel):
    """A candidate's line on a night's leaderboard (`leaderboard.json`'s `models`): its figures with their intervals,
    its counts and failures, and how it moved since the previous night. One that did not run has its reason and
    no figures (never zeros)."""

    model: str
    run_dir: str | None = None
    primary: str  # the ranking metric, `<task>/<setting>/<figure>`
    error: str | None = None  # why it did not run (or what stopped its server)
    status: Status = "ok"
    served: str | None = None  # the server the night brought for it
    server_error: str | None = None  # with the server log's last lines
    identity: RunIdentity = Field(default_factory=RunIdentity)  # its run.json
    metrics: dict[str, Interval] = Field(default_factory=dict)
    n_scored: int = 0
    n_failed: int = 0
    failures: dict[str, int] = Field(default_factory=dict)  # `task/setting stage: reason` -> units
    requests: Requests | None = None
    wall_s: float | None = None
    previous: dict[str, Interval] | None = None  # last night's metrics
    no_previous: str | None = None  # why there is no test since last night (the candidate skipped it)
    change: dict[str, Row] = Field(default_factory=dict)  # each metric's paired difference since last night
    regressions: list[str] = Field(default_factory=list)  # headline figures that dropped since last night
    setup_changed: list[str] = Field(default_factory=list)  # what changed besides the candidate: not comparable
    no_verdict: list[str] = Field(default_factory=list)  # why the change since last night has no verdict
    unanswered: list[str] = Field(default_factory=list)  # too many more units left unanswered: a regression
    baseline: str | None = None  # the night whose run is the candidate's fixed baseline
    baseline_set: str | None = None  # why tonight's run became the baseline (first night, setup changed)
    baseline_change: dict[str, Row] = Field(default_factory=dict)  # each metric's paired difference since the baseline
    baseline_regressions: list[str] = Field(default_factory=list)  # headline figures that dropped since the baseline
    baseline_no_verdict: list[str] = Field(default_factory=list)  # why the change since the baseline has no verdict

    def estimate(self, metric: str) -> float | None:
        return interval.estimate if (interval := self.metrics.get(metric)) is not None else None


class Leaderboard(BaseModel):
    """A night's `leaderboard.json`: its candidates ranked, what it served, and its exit code."""

    date: str
    dir: str
    error: str | None = None  # why the night did not start
    previous: str | None = None  # the night compared with
    config: str
    n_resamples: int = N_RESAMPLES
    plan: list[str] = Field(default_factory=list)
    servers_started: list[str] = Field(default_factory=list)
    servers_stopped_answering: dict[str, list[str]] = Field(default_factory=dict)
    requests: Requests = Field(default_factory=Requests)
    models: list[Entry] = Field(default_factory=list)
    regressions: list[str] = Field(default_factory=list)
    with_failures: list[str] = Field(default_factory=list)
    no_verdict: list[str] = Field(default_factory=list)  # candidates a comparison of tonight gave no verdict
    family_level: str = ""  # the night's family of headline tests: what is tested and bounded (`evalues.statement`)
    exit_code: int = 0
    report: str | None = None

    @classmethod
    def read(cls, path: Path) -> Leaderboard:
        try:
            return cls.model_validate_json(path.read_text(encoding="utf-8"))
        except (OSError, ValidationError) as e:
            raise ConfigError(f"{path}: not a leaderboard ({e})") from None


def run_dir_of(night_dir: Path, model: str) -> Path:
    """Where a night keeps a candidate's run (and its tracker run id, whether it ran or not)."""
    return night_dir / re.sub(r"[^A-Za-z0-9._-]+", "_", model)


def flag(entry: Entry) -> str:
    """A candidate's leaderboard flag in one word or two (a tracker's tag): DID NOT RUN, REGRESSION, FAILURES or ok."""
    if entry.status == "error":
        return "DID NOT RUN"
    if entry.regressions or entry.baseline_regressions or entry.unanswered:
        return "REGRESSION"
    if entry.no_verdict or entry.baseline_no_verdict:
        return "NO VERDICT"
    return "FAILURES" if entry.n_failed else "ok"


def flags_text(entry: Entry) -> str:
    flags = []
    if entry.regressions:
        flags.append("**REGRESSION** " + ", ".join(entry.regressions))
    if entry.baseline_regressions:
        flags.append(f"**REGRESSION** since the baseline ({entry.baseline}) " + ", ".join(entry.baseline_regressions))
    if entry.unanswered:
        flags.append("**REGRESSION** " + "; ".join(entry.unanswered))
    if entry.no_previous:
        flags.append(entry.no_previous)
    if entry.no_verdict:
        flags.append("**NO VERDICT** since last night: " + "; ".join(entry.no_verdict))
    if entry.baseline_no_verdict:
        flags.append("**NO VERDICT** since the baseline: " + "; ".join(entry.baseline_no_verdict))
    if entry.status == "error":
        flags.append(f"**DID NOT RUN**: {entry.error}")
    elif entry.n_failed:
        flags.append("**FAILURES**: " + ", ".join(f"{k} x{n}" for k, n in entry.failures.items()))
    if entry.setup_changed:
        flags.append("not comparable: " + "; ".join(entry.setup_changed))
    if entry.baseline_set and entry.baseline_set != FIRST_NIGHT:  # set again, not the first night's
        flags.append(f"baseline set again tonight: {entry.baseline_set}")
    return "; ".join(flags) or "ok"


def assemble(
    night: str,
    night_dir: Path,
    prev_dir: Path | None,
    config_path: str | Path,
    entries: list[Entry],
    error: str | None = None,
    plan: list[str] | None = None,
    started: list[str] | None = None,
    stopped_answering: dict[str, list[str]] | None = None,
    family_level: str = "",
) -> Leaderboard:
    """A night's leaderboard from its entries (left in their order), ranked by their headline figure, with the
    regressions, failures and no-verdicts its exit code sums (1 failures, 4 a regression, 8 no verdict)."""
    ranked = sorted(
        entries, key=lambda e: -(-1.0 if (estimate := e.estimate(e.primary)) is None else estimate)
    )  # 0.0 ranks above no figure
    regressions = (
        [f"{e.model}: {m}" for e in ranked for m in e.regressions]
        + [f"{e.model}: {m} since the baseline ({e.baseline})" for e in ranked for m in e.baseline_regressions]
        + [f"{e.model}: {why}" for e in ranked for why in e.unanswered]
    )
    no_verdict = [e.model for e in ranked if e.no_verdict or e.baseline_no_verdict]
    with_failures = [e.model for e in ranked if e.status != "ok"]
    return Leaderboard(
        date=night,
        dir=str(night_dir),
        error=error,
        previous=prev_dir.name if prev_dir else None,
        config=str(config_path),
        plan=plan or [],
        servers_started=started or [],
        servers_stopped_answering=stopped_answering or {},
        requests=sum((e.requests for e in ranked if e.requests), Requests()),
        models=ranked,
        regressions=regressions,
        with_failures=with_failures,
        no_verdict=no_verdict,
        family_level=family_level,
        exit_code=(EXIT_FAILED if with_failures or error else 0)
        | (EXIT_REGRESSION if regressions else 0)
        | (EXIT_NO_VERDICT if no_verdict else 0),
    )


def write_leaderboard(board: Leaderboard, night_dir: Path, root: Path) -> None:
    """The night's leaderboard, and the latest one at a fixed path; each file replaced whole."""
    text = {
        "leaderboard.json": board.model_dump_json(indent=2, exclude={"report"}),
        "leaderboard.md": leaderboard_markdown(board),
    }
    for directory in (night_dir, root):
        for name, content in text.items():
            write_atomic(directory / name, content)


# ---------------------------------------------------------------- leaderboard text


def _task(metric: str) -> TaskSpec:
    """The task whose figure `metric` is (`<task>/<setting>/<figure>`): it says how the figure is shown."""
    return TASKS[metric.split("/", 1)[0]]


def _cell(value: Interval | None, metric: str) -> str:
    return "-" if value is None else _task(metric).show_interval(value)  # a night that did not run ranks by "-"


def _change(entry: Entry, metric: str, since: str = "previous") -> str:
    """The paired difference since last night (or the baseline) with its interval: `-2.3 [-4.1, -0.5]`."""
    if metric not in entry.metrics:
        return "-"
    changes = entry.change if since == "previous" else entry.baseline_change
    if (row := changes.get(metric)) is None:
        return "new" if since == "previous" and not entry.no_previous else "-"
    show = _task(metric).show
    if not row.resolved or row.low is None or row.high is None:
        return show(row.difference, True) + f" ({row.personas} personas: no interval)"
    return show(row.difference, True) + f" [{show(row.low, True)}, {show(row.high, True)}]"


def _since_baseline(entry: Entry) -> str:
    if entry.baseline is None:
        return "-"
    if entry.baseline_set:
        return f"tonight is the baseline ({entry.baseline_set})"
    if not entry.baseline_change:
        return f"as the change ({entry.baseline})" if entry.change else f"{entry.baseline}: -"
    return f"{_change(entry, entry.primary, 'baseline')} since {entry.baseline}"


def leaderboard_markdown(board: Leaderboard) -> str:
    lines = [
        f"# CUPID nightly {board.date}",
        "",
        (
            f"Change since {board.previous or 'nothing (first night)'}, and since each candidate's baseline night, "
            "on the units both nights ran (the candidate's own failures as empty answers). 95% intervals, personas "
            f"resampled (none under {MIN_PERSONAS} personas); a change's interval is paired. **REGRESSION**: a task's "
            "headline figure (micro F1, the mean judge score; each persona's own, averaged) dropped at the gate's "
            "level, Holm across every headline test of the night (candidates x tasks x {previous, baseline}). "
            + (f"{board.family_level} " if board.family_level else "")
            + "F1 in % (micro: the published aggregate)."
        ),
        "",
        "| # | model | metric | tonight | change | since baseline | other metrics (change) | scored | failed | flag |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rank, e in enumerate(board.models, start=1):
        others = "; ".join(f"{m}: {_cell(v, m)} ({_change(e, m)})" for m, v in e.metrics.items() if m != e.primary)
        lines.append(
            f"| {rank} | {e.model} | {e.primary} | {_cell(e.metrics.get(e.primary), e.primary)} "
            f"| {_change(e, e.primary)} | {_since_baseline(e)} "
            f"| {others or '-'} | {e.n_scored} | {e.n_failed} | {flags_text(e)} |"
        )
    served = [f"- {e.served}" for e in board.models if e.served]  # only servers that started
    if served:
        lines += ["", "Served by the night:", *served]
    requests = board.requests
    started = ", ".join(board.servers_started) or "none"
    lines += [
        "",
        (
            f"Requests: {requests.sent} sent, {requests.cached} from the cache, "
            f"{requests.failed} failed; servers started: {started}."
        ),
        (
            f"{len(board.regressions)} regression(s), {len(board.with_failures)} model(s) with failures, "
            f"{len(board.no_verdict)} with no verdict; exit {board.exit_code}."
        ),
    ]
    for name, deaths in board.servers_stopped_answering.items():
        lines.append(f"Server {name} stopped answering {len(deaths)} time(s): " + " | ".join(deaths) + ".")
    if board.error:
        lines[1:1] = ["", f"**THE NIGHT DID NOT START**: {board.error}"]
    return "\n".join(lines) + "\n"
