"""Every figure computed in one place gives the numbers the several places gave before.

tests/data/figures_before_one_computation/ holds two run directories, each with the summary.json and the report's,
nightly's and meta-evaluation's figures (figures.json) that the code before the change wrote from its records
(`write.py` there says how): `sample`, records made for it over the bundled sample (two settings, failures at three
stages, a reference scoring), and `tiny`, a run of configs/eval/tiny.yaml on the tiny model under vLLM, two settings.
The figures are recomputed here from the same records by today's code and compared, number by number. The intervals'
bounds are not: they resample personas now where they resampled instances then (issue 35); the estimates and counts
stay, to the last few bits (a figure is the task's statistic at column sums now, where a macro mean was a `fmean`).
Figures added since (`NEW`) are not in the earlier files: they are checked to be there, and the rest compared.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cupid.eval.benchmark.rundir import RunDir
from cupid.eval.benchmark.summary import Summary, summarize
from cupid.eval.benchmark.tasks import TASKS
from cupid.eval.results import meta, report
from cupid.eval.workflows import nightly

BEFORE = Path(__file__).resolve().parents[1] / "data" / "figures_before_one_computation"
RUNS = ["sample", "tiny"]
NEW = {"missed"}  # inference: the share of units with F1 = 0


def _close(got, want) -> bool:
    """Equal, numbers to 12 significant digits, in nested dicts and lists."""
    if isinstance(want, dict):
        return isinstance(got, dict) and got.keys() == want.keys() and all(_close(got[k], want[k]) for k in want)
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(map(_close, got, want))
    if isinstance(want, float) and isinstance(got, (int, float)):
        return got == pytest.approx(want, rel=1e-12, abs=1e-15)
    return got == want


def _earlier(data):
    """`data` without the figures added since the earlier files were written."""
    if isinstance(data, dict):
        return {k: _earlier(v) for k, v in data.items() if k not in NEW}
    return [_earlier(v) for v in data] if isinstance(data, list) else data


def _before(name: str) -> tuple[dict, dict]:
    return json.loads((BEFORE / name / "summary.json").read_text()), json.loads(
        (BEFORE / name / "figures.json").read_text()
    )


@pytest.mark.parametrize("name", RUNS)
def test_summary_json_reads_typed_and_writes_back_the_same(name):
    written, _ = _before(name)
    summary = Summary.model_validate(written)
    assert json.loads(summary.to_json()) == written  # the typed model keeps summary.json's shape, key for key
    first = next(iter(summary.tasks.values()))
    assert first.overall == first.settings[first.setting].overall


@pytest.mark.parametrize("name", RUNS)
def test_the_summary_gives_the_same_figures_from_the_same_records(name):
    written, _ = _before(name)
    run = RunDir(BEFORE / name).load()
    plan = {TASKS[task]: list(written[task]["settings"]) for task in TASKS if task in written}
    identity = {
        k: v
        for k, v in written.items()
        if k not in TASKS
        and k not in ("reference", "reference_failures", "n_instances", "n_runs", "n_scored", "n_failed", "failures")
    }
    again = json.loads(summarize(run.records, plan, written["n_instances"], identity, "reference" in written).to_json())
    assert _close(_earlier(again), written)
    assert all(name in again["inference"] for name in NEW)  # the check can fail: the new figures are there


def _point(interval: dict | None) -> dict | None:
    """An interval's estimate (to the last few bits: a macro mean is a sum over a count now) and units: what must not
    change (the bounds now resample personas)."""
    return interval and {"estimate": round(interval["estimate"], 12), "n": interval["n"]}


def _rows(rows: list[report.FigureRow]) -> list[dict]:
    """Today's rows in the earlier form: cells named `<figure> <aggregate>` (`mean score`), estimates and units."""

    def earlier(metric: str) -> str:
        return "mean score" if metric == "mean_score" else " ".join(reversed(metric.split("_", 1)))

    return [
        {
            "setting": r.setting,
            "group": r.group,
            "n_scored": r.n_scored,
            "n_failed": r.n_failed,
            "cells": {earlier(m): _point(iv and iv.as_dict()) for m, iv in r.cells.items() if m not in NEW},
        }
        for r in rows
    ]


def _points(rows: list[dict]) -> list[dict]:
    return [{**row, "cells": {k: _point(v) for k, v in row["cells"].items()}} for row in rows]


@pytest.mark.parametrize("name", RUNS)
def test_the_report_gives_the_same_rows_and_failures(name):
    _, before = _before(name)
    run = report.load_run(BEFORE / name)
    for task in TASKS.values():
        assert _rows(report.task_rows(run, task)) == _points(before["report"][task.name])
        assert _rows(report.task_rows(run, task, reference=True)) == _points(before["report"][f"{task.name} reference"])
    assert [list(row) for row in report.failures_table(run)] == before["report"]["failures"]


@pytest.mark.parametrize("name", RUNS)
def test_the_nightly_gives_the_same_metrics_and_failures(name):
    _, before = _before(name)
    records = RunDir(BEFORE / name).read()
    assert {k: _point(v.as_dict()) for k, v in nightly.metrics(records).items()} == {
        k: _point(v) for k, v in before["nightly"]["metrics"].items()
    }
    assert nightly.failures_by_setting(records) == before["nightly"]["failures"]


@pytest.mark.parametrize("name", RUNS)
def test_the_meta_evaluation_gives_the_same_f1(name):
    _, before = _before(name)
    records = RunDir(BEFORE / name).read()
    for key, value in before["meta"]["run_f1"].items():
        setting, aggregate, *reference = key.split()
        assert _close(list(meta.run_f1(records, setting, aggregate, bool(reference))), value), key
    assert meta.f1_table([BEFORE / name]).values == before["meta"]["f1_table"]


def test_the_runs_compared_cover_what_could_differ():
    """Both runs have scored units in each task and setting; the sample also failed ones (at three stages) and a
    reference scoring."""
    for name in RUNS:
        written, _ = _before(name)
        for task in TASKS:
            assert len(written[task]["settings"]) == 2
            assert all(block["n_scored"] > 0 for block in written[task]["settings"].values())
    sample, _ = _before("sample")
    assert "reference" in sample and sample["n_failed"] > 0
    assert {stage for task in TASKS for stage in sample[task]["failed_by_stage"]} == {"decomposer", "matcher", "judge"}


@pytest.mark.parametrize("name", RUNS)
def test_a_summary_figure_is_its_intervals_estimate_to_the_bit(name):
    """One computation: summary.json's figure and the interval's estimate are the same float (the judge's mean score
    rounded to 4 places in summary.json, as it always was)."""
    from cupid.eval.benchmark.summary import figures

    records = RunDir(BEFORE / name).read()
    compared = 0
    for task in TASKS.values():
        for setting in sorted({r.setting for r in records if r.task == task.name}):
            chosen = [r for r in records if r.task == task.name and r.setting == setting]
            estimates = {m: iv.estimate for m, iv in task.intervals(chosen).items()}
            assert task.point(chosen) == estimates
            shown = figures(None, task.figures(chosen).model_dump())
            for metric, estimate in estimates.items():
                assert shown[metric] == (round(estimate, 4) if metric == "mean_score" else estimate), metric
                compared += 1
    assert compared >= len(next(iter(TASKS.values())).metrics)  # the check looked at figures
