"""A night's leaderboard as `leaderboard.json` holds it: its candidates' entries, and the flag each gets.

Its own module, below both the nightly that writes it (`eval.results.nightly`) and the tracker that logs it
(`eval.results.track`), so that neither imports the other.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from cupid.common.config import ConfigError
from cupid.eval.benchmark.rundir import RunIdentity
from cupid.eval.benchmark.stats import N_RESAMPLES, Interval
from cupid.eval.benchmark.summary import Requests
from cupid.eval.results.compare import Row

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
    baseline_pending: str | None = Field(default=None, exclude=True)  # why tonight becomes the baseline, if unflagged

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
    if entry.baseline_set and entry.previous is not None:  # set again, not the first night's
        flags.append(f"baseline set again tonight: {entry.baseline_set}")
    return "; ".join(flags) or "ok"
