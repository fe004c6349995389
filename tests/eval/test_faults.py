"""Faults an unattended run meets, injected for real: a file that is not a cache, two runs on one cache and on
one directory, a lock left by a killed run, a disk that fills up while records are written."""

import json
import os
import sqlite3
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from cupid.cli import app
from cupid.common.files import DiskFull, hold
from cupid.eval.benchmark.rundir import RunDir
from cupid.eval.benchmark.runner import RunConfig, run
from tests.helpers import REPO, write_endpoints


@pytest.fixture
def instant_endpoints(tmp_path, instant_url):
    return write_endpoints(
        tmp_path / "endpoints.yaml",
        instant={"base_url": instant_url, "model": "instant"},
        pm={"base_url": instant_url, "model": "local-prefmatcher"},
    )


def eval_args(endpoints, out, cache, *extra):
    return ["eval", "run", "--endpoints", str(endpoints), "--candidate", "instant", "--decomposer", "instant",
            "--matcher", "pm", "--out", str(out), "--cache", str(cache), *extra]  # fmt: skip


def test_a_cache_that_is_not_one_is_named_with_what_to_do(instant_endpoints, tmp_path, cupid_home):
    cache = tmp_path / "notes.sqlite"
    cache.write_text("my notes\n")
    result = CliRunner().invoke(app, eval_args(instant_endpoints, tmp_path / "run", cache))
    assert result.exit_code == 2, result.output
    assert f"request cache {cache}: not a SQLite file" in result.output and "--cache" in result.output
    assert "Traceback" not in result.output
    assert cache.read_text() == "my notes\n"


def test_two_runs_at_once_share_one_cache_and_lose_no_entry(instant_endpoints, tmp_path, cupid_home):
    cache = tmp_path / "cache.sqlite"
    env = {**os.environ, "CUPID_HOME": str(cupid_home)}
    runs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cupid",
                *eval_args(
                    instant_endpoints, tmp_path / f"run{i}", cache, "--setting", "standard", "--setting", "oracle"
                ),
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in (1, 2)
    ]
    outputs = [r.communicate(timeout=300)[0] for r in runs]
    assert [r.returncode for r in runs] == [0, 0], outputs
    summaries = [json.loads((tmp_path / f"run{i}" / "summary.json").read_text()) for i in (1, 2)]
    assert all(s["n_scored"] == 24 for s in summaries)
    entries = sqlite3.connect(cache).execute("SELECT COUNT(*) FROM responses").fetchone()[0]
    assert entries >= max(s["requests"]["sent"] for s in summaries) > 0
    third = run(
        RunConfig(
            endpoints=str(instant_endpoints),
            candidate="instant",
            decomposer="instant",
            matcher="pm",
            settings=["standard", "oracle"],
            out=str(tmp_path / "run3"),
            cache=str(cache),
        )
    ).summary
    assert (
        third.requests is not None and third.requests.sent == 0 and third.n_scored == 24
    )  # every answer either run got is in the cache


def test_a_second_run_on_a_held_directory_is_refused_naming_the_holder(instant_endpoints, tmp_path, cupid_home):
    out, cache = tmp_path / "run", tmp_path / "cache.sqlite"
    out.mkdir()  # an existing run directory (one that `hold` creates and leaves empty, it removes)
    with hold(out):  # a run of this process holds the directory
        result = CliRunner().invoke(app, eval_args(instant_endpoints, out, cache))
    assert result.exit_code == 2
    assert f"{out} is in use by another run (pid {os.getpid()};" in result.output
    assert not (out / "instances.jsonl").exists()  # refused before anything ran


def test_the_lock_a_dead_run_left_is_taken_over_saying_so(instant_endpoints, tmp_path, cupid_home):
    out, cache = tmp_path / "run", tmp_path / "cache.sqlite"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / ".lock").write_text(f"{dead.pid}\n")  # what a killed run leaves (the kernel already dropped its flock)
    result = CliRunner().invoke(app, eval_args(instant_endpoints, out, cache))
    assert result.exit_code == 0, result.output
    assert f"took over the lock left by pid {dead.pid}, which is no longer running" in result.output
    assert len((out / "instances.jsonl").read_text().splitlines()) == 12
    # A run that ended normally let go: the next one on the directory takes no lock over, and says nothing of it.
    assert (out / ".lock").read_text() == ""
    again = CliRunner().invoke(app, eval_args(instant_endpoints, out, cache))
    assert again.exit_code == 0 and "took over the lock" not in again.output, again.output


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs of this test's own (needs root, or skips); unmounted after."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=False, capture_output=True, text=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_stops_the_run_clearly_and_a_resume_loses_nothing(
    instant_endpoints, tmp_path, cupid_home, small_disk
):
    out = small_disk / "run"
    cfg = RunConfig(
        endpoints=str(instant_endpoints),
        candidate="instant",
        decomposer="instant",
        matcher="pm",
        out=str(out),
        cache=str(tmp_path / "cache.sqlite"),
    )
    filler = small_disk / "filler"
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    filler.write_bytes(b"\0" * (free - 3 * 4096))  # run.json, the lock and a few records' worth left
    with pytest.raises(DiskFull, match=rf"no space left on the device while writing the run in {out}") as stopped:
        run(cfg)
    kept = list(RunDir(out).records().values())  # complete lines; the one the disk cut off is torn
    assert 0 < len(kept) < 12 and f"The {len(kept)} record(s) written before are kept" in str(stopped.value)
    assert not (out / "summary.json").exists() and not list(out.glob(".*.tmp"))  # no half summary, no temp left

    filler.unlink()  # space freed: the same run resumes
    summary = run(cfg).summary
    assert summary.n_scored == 12 and summary.n_failed == 0
    after = RunDir(out).records()
    assert all(after[r.unit] == r for r in kept)  # what was written before is still there, unchanged
