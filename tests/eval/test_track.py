"""Runs and nights in an experiment tracker: the real `mlflow` package on a local store in a temporary
directory, the real `wandb` package in offline mode (nothing sent), read back through each tracker's own
reader (`mlflow.search_runs`/`load_table`, `wandb leet inspect`)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cupid.cli import app
from cupid.eval.benchmark.data import INSTANCE_TYPES
from cupid.eval.benchmark.generation import GENERATION
from cupid.eval.benchmark.inference import INFERENCE
from cupid.eval.benchmark.records import UnitRecord
from cupid.eval.benchmark.stats import MIN_PERSONAS
from tests.helpers import REPO, sample_copies, write_endpoints

CUPID = str(REPO / ".venv" / "bin" / "cupid")
EXPERIMENT = "cupid-tests"


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    """A local MLflow store in this test's directory, named by the environment as a user would (and its artifacts
    there too: MLflow puts them under the working directory of the process that makes the experiment)."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", EXPERIMENT)
    import mlflow

    mlflow.set_tracking_uri(uri)
    yield mlflow
    mlflow.set_tracking_uri(None)


def cupid(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CUPID, *args], check=False, capture_output=True, text=True, cwd=cwd, env={**os.environ, **(env or {})}
    )


def expected_metrics(summary: dict) -> dict[str, float]:
    """The figures `summary.json` holds, under the names the tracker gives them (written out here, not derived
    by the code under test)."""
    expected = {name: summary[name] for name in ("n_instances", "n_runs", "n_scored", "n_failed", "n_invalid_rows")}
    for task in ("inference", "generation"):
        for setting, block in summary.get(task, {}).get("settings", {}).items():
            for group, b in [("", block)] + [(f"/{t}", block["by_type"][t]) for t in INSTANCE_TYPES]:
                prefix = f"{task}/{setting}{group}"
                expected[f"{prefix}/n_scored"], expected[f"{prefix}/n_failed"] = b["n_scored"], b["n_failed"]
                for stage, n in b["failed_by_stage"].items():
                    expected[f"{prefix}/n_failed/{stage}"] = n
                for aggregate in ("micro", "macro"):
                    for name in ("precision", "recall", "f1"):
                        if b.get(aggregate):
                            expected[f"{prefix}/{aggregate}_{name}"] = b[aggregate][name]
                if b.get("missed") is not None:  # inference: the share of units with F1 = 0
                    expected[f"{prefix}/missed"] = b["missed"]
                if b.get("mean_score") is not None:
                    expected[f"{prefix}/mean_score"] = b["mean_score"]
    return expected


def test_a_tiny_run_tracked_in_mlflow_twice_is_one_run_with_its_files(tmp_path, tiny_server, mlflow_store, cupid_home):
    mlflow = mlflow_store
    endpoints = write_endpoints(
        tmp_path / "ep.yaml",
        cand={**tiny_server, "structured_output": True, "constrain_candidate": True},
        judgeformat={**tiny_server, "structured_output": True, "matcher_prompt": "prefmatcher"},
        freejudge=tiny_server,  # the random-weight judge without its format: failures the table must show as such
    )
    run_dir = tmp_path / "run"
    result = cupid("eval", "run", "--endpoints", str(endpoints), "--candidate", "cand", "--decomposer", "judgeformat",
                   "--matcher", "judgeformat", "--judge", "freejudge", "--task", "both", "--setting", "oracle",
                   "--limit", "3", "--out", str(run_dir), "--cache", str(tmp_path / "cache.sqlite"),
                   "--track", "mlflow", cwd=tmp_path)  # fmt: skip
    assert (run_dir / "summary.json").exists(), result.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    # vLLM holds candidate, decomposer and matcher to their formats (sized to max_tokens): the 3 inference units are
    # scored; the unconstrained judge's noise cannot hold its '### Evaluation Score': the 3 generation units fail
    assert (summary["n_scored"], summary["n_failed"]) == (3, 3), summary["failures"]
    assert summary["failures"] == {"generation/judge: parse_error": 3}
    assert result.returncode == 1, result.stderr
    assert "did not log" not in result.stderr

    runs = mlflow.search_runs(experiment_names=[EXPERIMENT])
    assert len(runs) == 1
    tracked = runs.iloc[0]
    assert json.loads((run_dir / "tracker.json").read_text())["mlflow"] == {
        os.environ["MLFLOW_TRACKING_URI"]: tracked.run_id
    }
    metrics = {
        k.removeprefix("metrics."): v for k, v in tracked.items() if k.startswith("metrics.") and not math.isnan(v)
    }  # NaN: not this run's
    expected = expected_metrics(summary)
    assert {k: metrics.get(k) for k in expected} == pytest.approx(expected)
    assert (
        tracked["params.role.candidate"] == summary["roles"]["candidate"] and tracked["params.data"] == summary["data"]
    )
    assert tracked["params.tasks"] == "inference,generation" and tracked["params.settings.inference"] == "oracle"
    assert tracked["params.prompt.prefmatcher"] == summary["prompts"]["prefmatcher"]

    # A run of the sample's few personas: its estimates, and no interval bounds published as numbers
    records = [UnitRecord.model_validate_json(line) for line in (run_dir / "instances.jsonl").read_text().splitlines()]
    interval = INFERENCE.intervals(records)["micro_f1"]
    assert interval.personas < MIN_PERSONAS and (interval.low, interval.high) == (None, None)
    assert metrics["inference/oracle/micro_f1"] == pytest.approx(interval.estimate)
    assert not [k for k in metrics if k.endswith(("_low", "_high"))]
    assert GENERATION.intervals(records).get("mean_score") is None  # no judge answer parsed: no score, never a zero
    assert not any(k.startswith("generation/oracle/mean_score") for k in metrics)

    def table():
        units = mlflow.load_table("units.json", run_ids=[tracked.run_id])
        return {
            (u.key, u.task, u.setting): (u.status, None if u.failed_stage != u.failed_stage else u.failed_stage)
            for u in units.itertuples()
        }

    statuses = {r.unit: (r.status, r.error.stage if r.error else None) for r in records}
    assert len(mlflow.load_table("units.json", run_ids=[tracked.run_id])) == len(records) == summary["n_runs"] == 6
    assert table() == statuses
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(tracked.run_id)}
    assert {"summary.md", "report.html", "view.html", "units.json"} <= artifacts
    assert (run_dir / "report" / "report.html").exists() and (run_dir / "report" / "view.html").exists()

    # logged again from its files (`tracker.json` names the run): the same tracker run, its table replaced, not
    # appended to
    again = cupid("track", str(run_dir), "--to", "mlflow", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().endswith(f"mlflow run {tracked.run_id}")
    runs = mlflow.search_runs(experiment_names=[EXPERIMENT])
    assert list(runs.run_id) == [tracked.run_id]
    assert table() == statuses and len(mlflow.load_table("units.json", run_ids=[tracked.run_id])) == 6

    # the same run into W&B, offline: its summary holds the same figures
    wandb_dir = tmp_path / "wandb-home"
    wandb_dir.mkdir()
    offline = {"WANDB_MODE": "offline", "WANDB_DIR": str(wandb_dir), "WANDB_PROJECT": "cupid-tests"}
    logged = cupid("track", str(run_dir), "--to", "wandb", cwd=tmp_path, env=offline)
    assert logged.returncode == 0, logged.stderr
    run_id = json.loads((run_dir / "tracker.json").read_text())["wandb"]["cupid-tests"]
    inspected = subprocess.run(
        [str(REPO / ".venv" / "bin" / "wandb"), "leet", "inspect", "--summary", "--json", str(wandb_dir / "wandb")],
        capture_output=True,
        text=True,
        check=True,
    )
    state = json.loads(inspected.stdout)
    assert (state["run_id"], state["project"], state["state"]) == (run_id, "cupid-tests", "finished")
    assert {k: state["summary"].get(k) for k in expected} == pytest.approx(expected)
    assert state["summary"]["units"]["nrows"] == 6
    assert state["config"]["role.candidate"] == summary["roles"]["candidate"]


def _run_args(endpoints: Path, out: Path, cache: Path) -> list[str]:
    return ["eval", "run", "--endpoints", str(endpoints), "--candidate", "instant", "--decomposer", "instant",
            "--matcher", "pm", "--out", str(out), "--cache", str(cache)]  # fmt: skip


@pytest.mark.slow  # ~12 s (two CLI processes, each importing MLflow): `make test` runs it
def test_a_tracker_that_fails_is_a_warning_and_the_run_stands(tmp_path, instant_url, cupid_home):
    endpoints = write_endpoints(
        tmp_path / "ep.yaml",
        instant={"base_url": instant_url, "model": "instant"},
        pm={"base_url": instant_url, "model": "local-prefmatcher"},
    )
    bad = {"MLFLOW_TRACKING_URI": "nowhere://tracker.invalid/x"}
    result = cupid(
        *_run_args(endpoints, tmp_path / "run", tmp_path / "cache.sqlite"), "--track", "mlflow", cwd=tmp_path, env=bad
    )
    assert result.returncode == 0, result.stderr  # the run's own status: every unit scored
    assert "warning: mlflow (tracking URI nowhere://tracker.invalid/x) did not log" in result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["n_scored"] == 12 and len((tmp_path / "run" / "instances.jsonl").read_text().splitlines()) == 12
    assert (tmp_path / "run" / "summary.md").exists()
    later = cupid(
        "track", str(tmp_path / "run"), cwd=tmp_path, env=bad
    )  # the command whose only job is the tracker fails
    assert later.returncode == 1 and "did not log" in later.stderr


def test_without_the_tracker_package_track_is_refused_before_any_request(tmp_path):
    endpoints = write_endpoints(
        tmp_path / "ep.yaml",
        instant={"base_url": "http://127.0.0.1:9/v1", "model": "instant"},
        pm={"base_url": "http://127.0.0.1:9/v1", "model": "pm"},
    )
    # as if the extra were not installed
    hidden = "import sys; sys.modules['wandb'] = None; from cupid.cli import app; app()"
    args = _run_args(endpoints, tmp_path / "run", tmp_path / "cache.sqlite") + ["--track", "wandb"]
    result = subprocess.run(
        [sys.executable, "-c", hidden, *args], check=False, capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 2
    assert "the wandb package is not installed" in result.stderr and "pip install -e '.[track]'" in result.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache.sqlite").exists()


@pytest.mark.slow  # ~15 s (two nights, each candidate logged to MLflow): `make test` runs it
def test_every_candidate_of_every_night_has_its_tracker_run(tmp_path, instant_url, mlflow_store, cupid_home):
    from cupid.eval.workflows.nightly import run_nightly

    mlflow = mlflow_store
    endpoints = write_endpoints(
        tmp_path / "ep.yaml",
        instant={"base_url": instant_url, "model": "instant"},
        pm={"base_url": instant_url, "model": "local-prefmatcher"},
    )
    models = ["instant", {"name": "untrained", "profile": "tiny", "adapter": str(tmp_path / "no-adapter")}]
    run = {
        "data": str(sample_copies(tmp_path / "personas.jsonl", 4)),  # 16 personas: intervals to log
        "endpoints": str(endpoints),
        "decomposer": "instant",
        "matcher": "pm",
        "cache": str(tmp_path / "cache.sqlite"),
    }
    night = {"models": models, "out": str(tmp_path / "nightly"), "report": False, "run": run}
    (tmp_path / "tracked.yaml").write_text(yaml.safe_dump({**night, "track": "mlflow"}))
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump(night))

    first, _ = run_nightly(tmp_path / "tracked.yaml", "2025-03-01")  # the file's `track:`
    second = CliRunner().invoke(
        app, ["nightly", "--config", str(tmp_path / "plain.yaml"), "--date", "2025-03-02", "--track", "mlflow"]
    )
    # the broken candidate's failure (1), not the tracker's, and no verdict on 16 personas (8)
    assert second.exit_code == 9, second.output
    boards = [
        first.model_dump(mode="json"),
        json.loads((tmp_path / "nightly" / "2025-03-02" / "leaderboard.json").read_text()),
    ]
    runs = mlflow.search_runs(experiment_names=[EXPERIMENT], order_by=["tags.`cupid.night` ASC"])
    assert sorted(zip(runs["tags.cupid.night"], runs["tags.cupid.candidate"], strict=True)) == [
        ("2025-03-01", "instant"),
        ("2025-03-01", "untrained"),
        ("2025-03-02", "instant"),
        ("2025-03-02", "untrained"),
    ]
    broken = runs[runs["tags.cupid.candidate"] == "untrained"]
    assert set(broken["tags.cupid.flag"]) == {"DID NOT RUN"} and set(broken["tags.cupid.status"]) == {"not run"}
    assert all("no-adapter not found (no adapter_config.json)" in reason for reason in broken["tags.cupid.reason"])

    # a metric's history across the nights, read back from the tracker
    f1 = "inference/standard/micro_f1"
    history = runs[runs["tags.cupid.candidate"] == "instant"]
    assert list(history["tags.cupid.flag"]) == ["ok", "NO VERDICT"]  # 16 personas: too few for a verdict
    on_board = [next(e for e in b["models"] if e["model"] == "instant")["metrics"][f1] for b in boards]
    assert list(history[f"metrics.{f1}"]) == pytest.approx([m["estimate"] for m in on_board])
    assert list(history[f"metrics.{f1}_low"]) == pytest.approx([m["low"] for m in on_board])
    # the second night's paired change since the first, beside its own figures (the first night has none)
    change = next(e for e in boards[1]["models"] if e["model"] == "instant")["change"][f1]
    logged = {
        k: list(history[f"metrics.compare/{f1}/difference{end}"])
        for k, end in (("difference", ""), ("low", "_low"), ("p_holm", "_p"))
    }
    assert {k: v[1] for k, v in logged.items()} == pytest.approx({k: change[k] for k in logged}) and all(
        v[0] != v[0] for v in logged.values()
    )

    # the night's directory logged again, one of its runs torn meanwhile: the same tracker runs, none added, and
    # the torn one still logged with its flag and what did not read
    (tmp_path / "nightly" / "2025-03-02" / "instant" / "summary.json").write_text('{"n_runs": 1')
    again = cupid("track", str(tmp_path / "nightly" / "2025-03-02"), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    runs = mlflow.search_runs(experiment_names=[EXPERIMENT])
    assert len(runs) == 4
    torn = runs[(runs["tags.cupid.candidate"] == "instant") & (runs["tags.cupid.night"] == "2025-03-02")].iloc[0]
    assert "summary.json: not valid JSON" in torn["tags.cupid.unreadable"] and torn["tags.cupid.flag"] == "NO VERDICT"


def test_a_served_profile_fingerprint_changes_with_its_fields_and_its_weights(tmp_path):
    from cupid.eval.benchmark.summary import Summary
    from cupid.eval.results.track import of_run
    from cupid.serving.fleet.on_demand import ServedModel
    from cupid.serving.fleet.run_servers import profile_fingerprints

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    candidate = ServedModel(name="cand", model=str(model), profile="tiny")
    directory = REPO / "configs" / "serve"
    first = profile_fingerprints({"tiny": {}}, [candidate], directory)
    assert set(first) == {"tiny", "cand"} and first == profile_fingerprints({"tiny": {}}, [candidate], directory)
    assert (
        profile_fingerprints({"tiny": {"vllm": {"max_model_len": 4096}}}, [candidate], directory)["tiny"]
        != first["tiny"]
    )
    (model / "model.safetensors").write_bytes(b"retrained")
    retrained = profile_fingerprints({"tiny": {}}, [candidate], directory)
    assert retrained["cand"] != first["cand"] and retrained["tiny"] == first["tiny"]
    summary = Summary(n_instances=0, n_runs=0, n_scored=0, n_failed=0, serve_profiles=retrained)
    params = of_run(None, records=[], summary=summary).params
    assert (params["serve.tiny"], params["serve.cand"]) == (retrained["tiny"], retrained["cand"])
