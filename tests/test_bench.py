"""`make bench` still runs end to end: its quick form, every section and server of the bench on a few short requests.

Nothing else runs the bench, and a full run takes ~15 minutes, so a change to the package it calls broke it unnoticed
once (a typed ServerRecord indexed as a dict, after its first vLLM start). Only whether each section ran and gave
figures is checked here, never their values: timing lives in the bench. The quick form serves the tiny random-weight
model (its directory, linked into a private state directory: nothing is downloaded)."""

import ast
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from bench.run import DEMO_CONFIG, LEVELS, OURS_IN_FLIGHT, QUICK, REFERENCE_WORKERS
from tests.helpers import REPO


def numbers(value: Any, where: str = "") -> Iterator[tuple[str, float]]:
    """Every number in the results, with where it is."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from numbers(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from numbers(item, f"{where}[{i}]")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield where, value


def test_the_quick_bench_runs_every_section(tmp_path, random_model_dir):
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    (home / "models" / random_model_dir.name).symlink_to(random_model_dir, target_is_directory=True)
    shipped = REPO / "bench" / "results.json"
    before = shipped.stat().st_mtime_ns if shipped.exists() else None
    out = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--out", str(out)], cwd=REPO,
        env={**os.environ, "CUPID_HOME": str(home)}, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert (shipped.stat().st_mtime_ns if shipped.exists() else None) == before, "the quick run overwrote results.json"
    assert done.stdout.rstrip().endswith(f"every figure in {out}")
    assert len(done.stdout.splitlines()) < 20  # the headline, not the JSON (in the file)
    assert not any(line.startswith(("{", '  "')) for line in done.stdout.splitlines())
    results = json.loads(out.read_text())
    assert results["workload"]["form"] == "quick"

    for where, x in numbers(results):
        assert math.isfinite(x) and x >= 0, f"{where}: {x}"

    overhead = results["client_overhead"]
    assert overhead["requests"] == QUICK.overhead_requests
    assert overhead["requests_per_s"] > 0 and overhead["client_cpu_ms_per_request"] > 0

    rerun = results["cached_rerun"]
    assert rerun["instances"] == QUICK.rerun_limit and rerun["cached_requests"] > 0
    assert rerun["wall_s"] > 0 and rerun["extrapolated_wall_s_per_756"] > 0

    # Each engine's demo ran every unit (a unit per task and instance: scored or failed), against a server it started.
    engines = results["vllm_vs_transformers_serve"]
    units = len(yaml.safe_load((REPO / DEMO_CONFIG).read_text())["tasks"]) * QUICK.demo_limit
    for name in ("vllm_cpu", "transformers_serve", "vllm_cpu_as_the_demo_runs_it"):
        demo = engines[name]
        assert "error" not in demo, f"{name}: {demo}"
        assert demo["units"] == units and demo["scored"] + demo["failed"] == units, f"{name}: {demo}"
        assert demo["wall_s"] > 0 and demo["requests"]["sent"] > 0, f"{name}: {demo}"
    for name, startup in engines["startup_s"].items():
        assert 0 < startup["ready_s"] <= startup["first_answer_s"], f"{name}: {startup}"
    assert engines["ratio_wall_transformers_over_vllm"] > 0 and engines["ratio_startup_vllm_over_transformers"] > 0
    assert engines["shared_requests"]["requests"] > 0  # both servers answered the same first requests
    assert results["vllm_startup_s"]["eager"] == engines["startup_s"]["vllm_cpu_eager"]

    compare = results["client_vs_reference"]
    for side in (compare[f"ours_{OURS_IN_FLIGHT}_in_flight"], compare[f"reference_{REFERENCE_WORKERS}_workers"]):
        assert side["requests"] == side["answered"] == QUICK.compare_requests, compare
        assert side["requests_per_s"] > 0 and side["completion_tokens"] > 0, compare
    assert compare["ratio_requests_per_s"] > 0

    # A night's statistics: the collapsed candidate's four headline tests flagged, and no other.
    (night,) = results["night_statistics"]
    assert (night["candidates"], night["headline tests"], night["flagged"]) == (2, 8, 4), night
    assert night["total s"] >= 0

    levels = results["concurrency_tiny_vllm_cpu"]
    assert set(levels) == {str(n) for n in LEVELS} and all(x["requests_per_s"] > 0 for x in levels.values()), levels
    assert results["machine"]["bench_wall_s"] > 0

    # The headline: a line per section, transformers serve's with its figures (not its error).
    lines = done.stdout.splitlines()
    assert any(line.startswith("demo workload (") and "vLLM CPU:" in line for line in lines)
    assert any(line.startswith("demo workload, transformers serve:") for line in lines)
    assert any(f"this client ({OURS_IN_FLIGHT} in flight)" in line for line in lines)
    assert any(line.startswith("a night's statistics, 2 candidates (8 headline tests") for line in lines)
    by_level = next(line for line in lines if line.startswith("requests/s on vLLM CPU by in flight: "))
    assert [part.split(":")[0] for part in by_level.split(": ", 1)[1].split(", ")] == [str(n) for n in LEVELS]


@pytest.mark.slow  # ~8 s (`python -m bench.view`: each page opened in Chromium): `make test` runs it
def test_the_viewer_bench_runs_in_a_real_browser(tmp_path):
    """`python -m bench.view` (by hand, as docs/evaluating.md shows it): its synthetic runs load as runs, and each
    page's figures come back from Chromium."""
    if not os.path.exists("/usr/bin/chromium"):
        pytest.skip("/usr/bin/chromium not installed (apt-get install -y chromium; `make test` does it as root)")
    result = subprocess.run(
        [sys.executable, "-m", "bench.view", "--instances", "24", "--history-chars", "2000"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("synthetic full run: 24 instances, 168 units per run")
    for name in ("one run", "two runs compared"):
        line = next(line for line in lines if line.startswith(f"{name}: page "))
        assert "every unit openable" in line and "opening a unit" in line


def test_the_gate_level_bench_gives_both_tests_rates_and_the_power_with_its_interval():
    out = subprocess.run(
        [sys.executable, "-m", "bench.gate_level", "--tests", "50", "--power-draws", "20",
         "--laws", "sparse: 2% gain 0.5, 8% lose 0.125", "--power-laws", "normal, sd 0.15"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rows = [ast.literal_eval(line) for line in out.splitlines() if line.startswith("{")]
    level, power = rows[:3], rows[3:]
    assert [row["personas"] for row in level] == [80, 138, 252]
    assert all(set(row) >= {"m=1", "m=2", "m=8", "m=20", "m=80"} for row in level)
    assert all(0 <= rate <= 100 for row in level for key, pair in row.items() if key[:2] == "m=" for rate in pair)
    assert len(power) == 9 and all(0 < row["detectable"] < 1 and "[" in row["at detectable"] for row in power)


def test_the_nights_bench_counts_false_alarms_and_finds_a_drop():
    out = subprocess.run(
        [sys.executable, "-m", "bench.gate_nights", "--labs", "2", "--nights", "3", "--horizon", "1", "--drop", "0.3"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    null, found = (ast.literal_eval(line) for line in out.strip().splitlines())
    assert null["labs"] == 2 and null["false alarms per lab"] >= 0
    assert found["within 1"].startswith("100.0%")  # every persona 0.3 lower: flagged on its first night
