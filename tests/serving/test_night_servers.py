"""A night that brings its own vLLM servers (CPU build, the tiny random-weight model: plumbing): judges found already
answering and used as they are, a LoRA candidate loaded into the judges' server (unloaded after), a
candidate whose start fails (recorded, the night goes on), a LoRA candidate served after it on the same
port, nothing it started left running; a second night sends
nothing and starts nothing; an interrupted night stops the judges' server it was starting."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from cupid.eval.workflows.nightly import run_nightly
from cupid.serving.servers import probes
from cupid.serving.servers.ports import free_port
from tests.helpers import RANDOM_SERVING, REPO, TINY_NAME, heeds_ctrl_c, write_endpoints


@pytest.fixture(scope="module")
def night_parts(tmp_path_factory, random_model_dir):
    """A serve-profile directory with two judges' profiles (the shipped `tiny` one: `judge` on a free port, started by
    the night; `sessionjudge` at the session's tiny server, which the night finds answering and uses), and an
    untrained LoRA adapter for the tiny model (real PEFT weights: B = 0, so it answers as the base)."""
    root = tmp_path_factory.mktemp("night")
    shipped = yaml.safe_load((REPO / "configs/serve/tiny.yaml").read_text())
    (root / "profiles").mkdir()
    judge = {**shipped, "model": str(random_model_dir), "served_name": TINY_NAME, "port": free_port(),
             **RANDOM_SERVING}  # fmt: skip
    (root / "profiles/judge.yaml").write_text(yaml.safe_dump(judge))

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(random_model_dir)
    get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])).save_pretrained(
        root / "adapter"
    )
    return root


def night_config(root, tmp_path, models, cache, judge_profile="judge", **candidates):
    judge_port = yaml.safe_load((root / f"profiles/{judge_profile}.yaml").read_text())["port"]
    endpoints = write_endpoints(
        tmp_path / "endpoints.yaml",
        judge={
            "base_url": f"http://127.0.0.1:{judge_port}/v1",
            "model": TINY_NAME,
            "max_tokens": 64,
            "structured_output": True,
            "timeout_s": 600,
        },
        **candidates,
    )
    path = tmp_path / f"night-{len(list(tmp_path.glob('night-*.yaml')))}.yaml"
    # The oracle setting: the instance's relevant sessions only, a prompt ~4x shorter than the standard setting's
    # for the candidate (what a night does with its servers does not depend on the setting).
    run = {
        "data": "sample",
        "endpoints": str(endpoints),
        "profiles": str(root / "profiles"),
        "serve": [judge_profile],
        "decomposer": "judge",
        "matcher": "judge",
        "tasks": ["inference"],
        "settings": ["oracle"],
        "limit": 1,
        "cache": str(cache),
    }
    path.write_text(
        yaml.safe_dump(
            {
                "models": models,
                "out": str(tmp_path / "nightly"),
                "report": False,
                "candidate_port": free_port(),
                "run": run,
            }
        )
    )
    return path


def vllm_processes_of(root) -> list[psutil.Process]:
    """vLLM processes started from this test's profiles (the session's own tiny server is not one of them)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "vllm" in cmd and (str(root) in cmd or "lora-cand" in cmd):
            found.append(proc)
    return found


def test_a_night_serves_judges_once_candidates_in_turn_and_leaves_nothing_running(
    night_parts, tmp_path, cupid_home, tiny_server
):
    # The judges' profile points at the session's tiny server: the night finds it answering, uses it, leaves it up.
    # That server loads adapters at run time (tests/conftest.py), as the profile says: a LoRA candidate on it rides.
    port = int(tiny_server["base_url"].rsplit(":", 1)[1].split("/")[0])
    judge = yaml.safe_load((night_parts / "profiles/judge.yaml").read_text())
    (night_parts / "profiles/sessionjudge.yaml").write_text(
        yaml.safe_dump({**judge, "port": port, "runtime_lora_rank": 8})
    )
    lora = {"name": "lora-cand", "profile": "judge", "adapter": str(night_parts / "adapter"),
            "endpoint": {"max_tokens": 64, "constrain_candidate": True, "timeout_s": 600}}  # fmt: skip
    rider = {**lora, "name": "lora-rider", "profile": "sessionjudge"}
    # Refused by the night's check of each candidate, before any server starts (a start that fails inside vLLM, with
    # its root cause from the log, is tested in test_serve.py; the night records either kind the same way).
    broken = {"name": "broken-cand", "profile": "judge", "model": str(night_parts / "no-such-model")}
    cache = tmp_path / "cache.sqlite"

    board, code = run_nightly(
        night_config(night_parts, tmp_path, ["judge", broken, lora, rider], cache, "sessionjudge"), "2026-01-01"
    )
    board = board.model_dump(mode="json")  # as leaderboard.json holds it
    entries = {e["model"]: e for e in board["models"]}
    assert code & 1  # failures: the broken candidate
    failed = entries["broken-cand"]
    assert failed["status"] == "error" and failed["error"].startswith("candidate 'broken-cand': model directory")
    assert "no-such-model not found" in failed["error"]
    # DID NOT RUN: the reason stands for its units (none counted as failed), and no server is listed as served
    assert (failed["n_scored"], failed["n_failed"], failed["failures"], failed["served"]) == (0, 0, {}, None)
    served_lines = (
        (tmp_path / "nightly/2026-01-01/leaderboard.md").read_text().split("Served by the night:")[1].split("\n\n")[0]
    )
    assert "broken-cand" not in served_lines and "lora-cand" in served_lines
    for name in ("judge", "lora-cand", "lora-rider"):  # the night went on after the failure, on the same port
        assert entries[name]["n_scored"] + entries[name]["n_failed"] == 1
        assert entries[name]["failures"].keys().isdisjoint({"inference/oracle candidate: server_not_started"})
    assert entries["lora-cand"]["requests"]["sent"] > 0 and "+ LoRA lora-cand@" in entries["lora-cand"]["served"]
    fingerprints = json.loads((tmp_path / "nightly/2026-01-01/lora-cand/summary.json").read_text())["serve_profiles"]
    assert set(fingerprints) == {"sessionjudge", "lora-cand"}  # what served it, for the tracker's params
    assert board["servers_started"] == ["lora-cand"]  # the judges' server was up already; the rider needed none
    served = entries["lora-rider"]["served"]
    assert entries["lora-rider"]["requests"]["sent"] > 0 and f"loaded into sessionjudge's server, :{port}" in served
    assert not any(
        " candidate: http_" in k for k in entries["lora-rider"]["failures"]
    )  # its served name answered (no 404)
    listed = httpx.get(tiny_server["base_url"] + "/models")
    assert listed.status_code == 200  # the judges' server is still up, the rider's adapter unloaded from it

    # The next night is answered wholly from the cache: it starts no server, and lists none as served by it.
    again, _ = run_nightly(
        night_config(night_parts, tmp_path, ["judge", lora, rider], cache, "sessionjudge"), "2026-01-02"
    )
    assert again.servers_started == [] and again.requests.sent == 0
    assert [e.served for e in again.models] == [None] * 3
    assert "Served by the night" not in (tmp_path / "nightly/2026-01-02/leaderboard.md").read_text()
    assert served.split(" ")[0] not in [m["id"] for m in listed.json()["data"]]
    assert list((cupid_home / "servers").glob("*.json")) == []  # every record removed by `down`
    assert vllm_processes_of(night_parts) == []
    board_md = (tmp_path / "nightly/2026-01-01/leaderboard.md").read_text()
    assert "lora-cand" in board_md and "broken-cand" in board_md and "servers started: lora-cand" in board_md

    again, code = run_nightly(
        night_config(night_parts, tmp_path, ["judge", lora, rider], cache, "sessionjudge"), "2026-01-02"
    )
    assert again.requests.sent == 0 and again.requests.cached > 0
    assert again.servers_started == []  # every answer was in the cache: no server was needed
    assert {e.model: e.status for e in again.models} == {
        n: entries[n]["status"] for n in ("judge", "lora-cand", "lora-rider")
    }


def test_an_interrupted_night_stops_the_server_it_was_starting(night_parts, tmp_path, cupid_home):
    config = night_config(night_parts, tmp_path, ["judge"], tmp_path / "fresh-cache.sqlite")
    night = subprocess.Popen(
        [sys.executable, "-m", "cupid", "nightly", "--config", str(config)], cwd=REPO,
        env={**os.environ, "CUPID_HOME": str(cupid_home)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=heeds_ctrl_c,  # noqa: PLW1509
    )  # fmt: skip
    record = cupid_home / "servers" / "judge.json"
    deadline = time.monotonic() + 120
    while not record.exists() and time.monotonic() < deadline and night.poll() is None:
        time.sleep(0.2)
    assert record.exists(), night.communicate()[0]
    pgid = json.loads(record.read_text())["pid"]
    time.sleep(3)  # vLLM is loading: the hard moment to stop it
    night.send_signal(signal.SIGINT)
    output, _ = night.communicate(timeout=90)
    assert night.returncode == 130, output  # Ctrl-C's code
    assert "nightly: stopped judge" in output, output
    assert "ready in" not in output and not list(tmp_path.rglob("leaderboard.md")), output  # stopped while starting
    assert not record.exists()
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)  # the whole process group is gone, engine processes included


def test_a_judge_killed_mid_night_is_restarted_once_and_then_recorded_as_gone(
    night_parts, tmp_path, cupid_home, monkeypatch
):
    """The night's judge (real vLLM on CPU, loading adapters at run time) is SIGKILLed, process group and all, before
    the second candidate, a LoRA candidate on it: it is restarted, the adapter loaded into the new server, and that
    candidate answered; killed again before the third, it is not restarted twice, and the third's units are
    failures that say why."""
    from cupid.eval.workflows import nightly
    from cupid.serving.servers.instant import start as start_instant

    instants = [
        start_instant("--preference", f"Answers should mention {word} first.")
        for word in ("apples", "rivers", "clocks")
    ]
    try:
        candidates = {
            f"cand-{i}": {"base_url": url, "model": f"instant-{i}"}
            for i, (_, url) in enumerate(instants, start=1)
            if i != 2
        }
        judge = yaml.safe_load((night_parts / "profiles/judge.yaml").read_text())
        (night_parts / "profiles/lorajudge.yaml").write_text(
            yaml.safe_dump({**judge, "port": free_port(), "runtime_lora_rank": 8})
        )
        rider = {
            "name": "cand-2",
            "profile": "lorajudge",
            "adapter": str(night_parts / "adapter"),
            "endpoint": {"max_tokens": 64, "constrain_candidate": True, "timeout_s": 600},
        }
        models = ["cand-1", rider, "cand-3"]
        config = night_config(
            night_parts, tmp_path, models, tmp_path / "cache.sqlite", judge_profile="lorajudge", **candidates
        )
        real_run_one, killed = nightly.run_one, []

        def run_one_after_killing_the_judge(name, *args):
            if name != "cand-1":  # the judge answered cand-1: kill it as the OOM killer would
                pgid = json.loads((cupid_home / "servers" / "lorajudge.json").read_text())["pid"]
                os.killpg(pgid, signal.SIGKILL)
                killed.append(pgid)
                deadline = (
                    time.monotonic() + 60
                )  # dead, not dying: its death is then seen as such (not as a failed health check)
                while probes.alive(pgid) and time.monotonic() < deadline:
                    time.sleep(0.1)
            return real_run_one(name, *args)

        monkeypatch.setattr(nightly, "run_one", run_one_after_killing_the_judge)
        board, code = run_nightly(config, "2026-02-01")
    finally:
        for proc, _ in instants:
            proc.terminate()
            proc.wait()
    board = board.model_dump(mode="json")  # as leaderboard.json holds it
    entries = {e["model"]: e for e in board["models"]}
    assert len(killed) == 2 and len(set(killed)) == 2  # the second kill hit the restarted server
    assert (entries["cand-1"]["status"], entries["cand-1"]["n_scored"]) == ("ok", 1), entries["cand-1"]
    rider = entries["cand-2"]  # the tiny model may answer badly; its adapter answered, on the restarted server
    assert rider["n_scored"] + rider["n_failed"] == 1 and rider["requests"]["sent"] > 0, rider
    assert rider["error"] is None and not any(why in k for k in rider["failures"] for why in ("server_", "http_")), (
        rider
    )
    assert "loaded into lorajudge's server" in rider["served"]
    gone = entries["cand-3"]
    assert (gone["status"], gone["n_scored"], gone["n_failed"]) == ("failed", 0, 1) and gone["metrics"] == {}
    assert [k.split(" ", 1)[1].split(":")[0] for k in gone["failures"]] == ["decompose"] and all(
        "server_died" in k for k in gone["failures"]
    )
    deaths = board["servers_stopped_answering"]["lorajudge"]
    assert len(deaths) == 2 and all(d.startswith("its process is gone; its log: ") for d in deaths)
    kept = [Path(d.split("its log: ")[1]) for d in deaths]
    assert all(p.exists() and p.stat().st_size > 0 for p in kept)  # the dead servers' logs, kept for the morning
    assert code & 1
    assert (
        "Server lorajudge stopped answering 2 time(s)" in (tmp_path / "nightly/2026-02-01/leaderboard.md").read_text()
    )
    assert vllm_processes_of(night_parts) == [] and list((cupid_home / "servers").glob("*.json")) == []
