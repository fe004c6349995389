"""Where a night's servers go, computed without GPUs: judges once on the first GPU(s), candidates in turn
beside them on one GPU, on a GPU of their own on two, side by side on eight; and the candidates that
are models (a Hub id, a directory, a LoRA adapter on a base) as the profiles and endpoints they become.
Nothing here starts a server."""

import json
import os
import time

import pytest
from typer.testing import CliRunner

from cupid.cli import app
from cupid.common.config import ConfigError
from cupid.common.errors import ServeError
from cupid.serving.fleet.gpu_memory import Gpu
from cupid.serving.fleet.on_demand import ServedModel, fingerprint
from cupid.serving.fleet.placement import SHARED_CEILING
from cupid.serving.fleet.run_servers import judge_profiles, plan_servers
from cupid.serving.servers.vllm_args import engine_env, vllm_args, vllm_defaults
from tests.helpers import REPO

SERVE_DIR = REPO / "configs" / "serve"
JUDGES = {
    "prefmatcher": {"vllm": {"gpu_memory_utilization": 0.25}},
    "qwen2.5-7b-instruct": {"vllm": {"gpu_memory_utilization": 0.3}},
}


def h100s(n: int) -> list[Gpu]:
    return [Gpu(i, "NVIDIA H100 80GB HBM3", 81559, 0) for i in range(n)]


def candidates(n: int, **serve) -> list[ServedModel]:
    return [
        ServedModel(
            name=f"cand-{i}",
            model=f"org/model-{i}",
            profile="qwen2.5-7b-instruct",
            serve={"weights_gib": 15.0, **serve},
        )
        for i in range(n)
    ]


def gpus_of(run_servers) -> dict[str, tuple[int, ...]]:
    return {s.profile.name: s.placed.gpus for s in [*run_servers.judges, *run_servers.candidates()]}


def test_one_gpu_candidates_take_turns_beside_the_judges_with_the_memory_they_leave():
    run_servers = plan_servers(JUDGES, candidates(3), h100s(1), directory=SERVE_DIR)
    plan = run_servers
    assert set(gpus_of(plan).values()) == {(0,)}
    assert run_servers.slot_names == [["cand-0", "cand-1", "cand-2"]]  # one slot: in turn
    assert {c.profile.port for c in plan.candidates()} == {8100}
    assert all(c.profile.gpu_memory_utilization == pytest.approx(SHARED_CEILING - 0.55) for c in plan.candidates())
    assert [j.placed.env for j in plan.judges] == [{"CUDA_VISIBLE_DEVICES": "0"}] * 2
    assert plan.problems == []


def test_two_gpus_put_judges_on_the_first_and_candidates_in_turn_on_the_second():
    plan = plan_servers(JUDGES, candidates(3), h100s(2), directory=SERVE_DIR)
    assert [j.placed.gpus for j in plan.judges] == [(0,), (0,)]
    assert [c.placed.gpus for c in plan.candidates()] == [(1,)] * 3
    assert {c.profile.gpu_memory_utilization for c in plan.candidates()} == {
        vllm_defaults()["gpu_memory_utilization"]
    }  # vLLM's, not the base profile's 0.45
    assert [c.placed.env for c in plan.candidates()] == [{"CUDA_VISIBLE_DEVICES": "1"}] * 3
    assert len(plan.slots) == 1


def test_eight_gpus_seven_slots_side_by_side_each_with_its_own_port():
    run_servers = plan_servers(JUDGES, candidates(9), h100s(8), directory=SERVE_DIR)
    plan = run_servers
    assert len(plan.slots) == 7
    assert run_servers.slot_names[0] == ["cand-0", "cand-7"] and run_servers.slot_names[1] == [
        "cand-1",
        "cand-8",
    ]  # two waves
    assert [slot[0].placed.gpus for slot in plan.slots] == [(g,) for g in range(1, 8)]
    assert [slot[0].profile.port for slot in plan.slots] == list(range(8100, 8107))
    text = "\n".join(plan.lines())
    assert "8 x NVIDIA H100" in text and "7 side by side" in text and "cand-8@" in text


def test_tensor_parallel_candidates_get_slots_of_their_width():
    plan = plan_servers(JUDGES, candidates(4, vllm={"tensor_parallel_size": 2}), h100s(8), directory=SERVE_DIR)
    assert [slot[0].placed.gpus for slot in plan.slots] == [(1, 2), (3, 4), (5, 6)]  # GPU 7 left: a slot needs two
    assert plan.slots[0][0].placed.env == {"CUDA_VISIBLE_DEVICES": "1,2"}


def test_plans_that_cannot_work_are_refused_before_anything_starts():
    greedy = {
        "prefmatcher": {"vllm": {"gpu_memory_utilization": 0.5}},
        "qwen2.5-7b-instruct": {"vllm": {"gpu_memory_utilization": 0.45}},
    }
    with pytest.raises(ServeError, match="leave it no GPU memory"):
        plan_servers(greedy, candidates(1), h100s(1), directory=SERVE_DIR)
    with pytest.raises(ServeError, match="less than the"):  # 0.4 of a 24 GiB GPU cannot hold 15 GiB of weights
        plan_servers(JUDGES, candidates(1), [Gpu(0, "NVIDIA GeForce RTX 4090", 24564, 0)], directory=SERVE_DIR)
    with pytest.raises(ServeError, match="needs 4 GPU"):
        plan_servers(JUDGES, candidates(1, vllm={"tensor_parallel_size": 4}), h100s(2), directory=SERVE_DIR)
    with pytest.raises(ServeError, match="no GPU is visible"):
        plan_servers(JUDGES, candidates(1), [], directory=SERVE_DIR)


def test_cpu_plan_one_slot_beside_the_judges_no_gpu_settings(tmp_path):
    run_servers = plan_servers(
        {"tiny": {}},
        [ServedModel(name="a", profile="tiny"), ServedModel(name="b", profile="tiny")],
        [],
        directory=SERVE_DIR,
    )
    plan = run_servers
    assert run_servers.slot_names == [["a", "b"]]
    assert [c.placed.gpus for c in plan.candidates()] == [(), ()] and all(c.placed.env == {} for c in plan.candidates())
    assert plan.judges[0].profile.port == 8011 and {c.profile.port for c in plan.candidates()} == {8100}
    profile = run_servers.candidate_servers["a"].profile
    assert "--gpu-memory-utilization" not in vllm_args(profile) and engine_env(profile)["VLLM_CPU_KVCACHE_SPACE"] == "3"


def test_a_judges_profile_takes_field_overrides():
    [judge] = judge_profiles({"prefmatcher": {"vllm": {"gpu_memory_utilization": 0.3}}}, SERVE_DIR)
    assert judge.gpu_memory_utilization == 0.3 and judge.model == "kixlab/prefmatcher-7b"


def test_a_judges_model_cannot_be_overridden_nor_its_profile_missing():
    with pytest.raises(ConfigError, match="serve.prefmatcher.model"):
        judge_profiles({"prefmatcher": {"model": "other/model"}}, SERVE_DIR)
    with pytest.raises(ConfigError, match="no serve profile 'nope'"):
        judge_profiles({"nope": {}}, SERVE_DIR)


def adapter(path, rank=8):
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": rank, "peft_type": "LORA"}))
    (path / "adapter_model.safetensors").write_bytes(b"weights")
    return path


def test_a_lora_candidate_is_served_on_its_base_and_answers_as_itself(tmp_path):
    served = ServedModel(
        name="mine",
        profile="qwen2.5-7b-instruct",
        adapter=str(adapter(tmp_path / "a", rank=16)),
        endpoint={"max_tokens": 99},
    )
    profile = served.to_profile(SERVE_DIR)
    [(name, path)] = profile.lora_adapters.items()
    assert name.startswith("mine@") and path == str(tmp_path / "a") and profile.arg("max_lora_rank") == 16
    assert profile.model == "Qwen/Qwen2.5-7B-Instruct" and profile.served == "mine-base"
    endpoint = served.to_endpoint(profile.model_copy(update={"port": 8105}))
    assert endpoint.model == name and endpoint.url == "http://127.0.0.1:8105/v1" and endpoint.max_tokens == 99
    assert endpoint.structured_output  # vLLM enforces answer formats


def test_a_lora_candidate_on_a_judge_that_loads_adapters_rides_on_the_judges_server(tmp_path, capsys):
    """On a judge's profile that loads adapters at run time (`runtime_lora_rank`, here set for the night under
    `serve:`), a LoRA candidate needs no server: it is asked at the judge's address under its own served name.
    Above that rank, with `serve:` fields of its own, or on a judge without the setting, it is served on its own."""
    small, large = str(adapter(tmp_path / "small", rank=16)), str(adapter(tmp_path / "large", rank=128))
    judges = {**JUDGES, "qwen2.5-7b-instruct": {"vllm": {"gpu_memory_utilization": 0.3}, "runtime_lora_rank": 64}}
    cands = [
        ServedModel(name="rider", profile="qwen2.5-7b-instruct", adapter=small, endpoint={"max_tokens": 99}),
        ServedModel(name="big", profile="qwen2.5-7b-instruct", adapter=large),
        ServedModel(
            name="tuned", profile="qwen2.5-7b-instruct", adapter=small, serve={"vllm": {"max_model_len": 2048}}
        ),
        ServedModel(name="on-pm", profile="prefmatcher", adapter=small),
    ]
    run_servers = plan_servers(judges, cands, h100s(1), directory=SERVE_DIR)
    assert list(run_servers.riders) == ["rider"] and run_servers.slot_names == [["big", "tuned", "on-pm"]]
    rider = run_servers.riders["rider"]
    assert rider.host is next(s for s in run_servers.judges if s.profile.name == "qwen2.5-7b-instruct")
    assert [rider.served] == list(
        cands[0].to_profile(SERVE_DIR).lora_adapters
    ) and rider.adapter == small  # its name on its own
    endpoint = run_servers.endpoints["rider"]
    assert endpoint.model == rider.served and endpoint.url == "http://127.0.0.1:8001/v1" and endpoint.max_tokens == 99
    assert (
        run_servers.server_of("rider") is rider and run_servers.server_of("big") is run_servers.candidate_servers["big"]
    )
    lines = run_servers.lines()
    assert (
        lines[lines.index("  candidates on a judge's server:") + 1]
        == f"    rider: {rider.served} (LoRA {small}) loaded into qwen2.5-7b-instruct's server, :8001"
    )
    alone = plan_servers(judges, cands[:1], h100s(1), directory=SERVE_DIR).lines()
    assert not any(line.startswith("  candidates, ") for line in alone)  # no slot to list
    assert (
        plan_servers(JUDGES, cands[:1], h100s(1), directory=SERVE_DIR).riders == {}
    )  # the judge does not load adapters


def test_the_served_name_changes_when_the_weights_do(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"v1")
    before = fingerprint(str(model))
    assert fingerprint(str(model)) == before  # stable: tomorrow's night reuses the cache
    time.sleep(0.01)
    (model / "model.safetensors").write_bytes(b"v2")
    assert fingerprint(str(model)) != before
    assert ServedModel(name="m", model=str(model)).to_profile(SERVE_DIR).served == f"m@{fingerprint(str(model))}"


def test_bad_candidates_are_refused_with_the_field_named(tmp_path):
    with pytest.raises(ValueError, match="give `model`"):
        ServedModel(name="x")
    with pytest.raises(ValueError, match="serve.port is set by the run"):
        ServedModel(name="x", model="org/m", serve={"port": 9000})
    with pytest.raises(ConfigError, match="adapter_config.json"):
        ServedModel(name="x", profile="tiny", adapter=str(tmp_path / "missing")).to_profile(SERVE_DIR)
    with pytest.raises(ConfigError, match="(?s)candidate 'x'.*--dtype: invalid choice: 'int3'"):
        ServedModel(name="x", model="org/m", serve={"vllm": {"dtype": "int3"}}).to_profile(SERVE_DIR)


def test_nightly_dry_run_prints_the_plan_for_eight_gpus_and_starts_nothing(tmp_path, cupid_home):
    result = CliRunner().invoke(
        app, ["nightly", "--config", str(REPO / "configs/eval/nightly.yaml"), "--dry-run", "--gpus", "8"]
    )
    assert result.exit_code == 0, result.output
    assert "plan on 8 x assumed GPU (80 GiB)" in result.output and "GPU 0, :8000, 0.25" in result.output
    assert "on GPU 2, :8101, 0.9" in result.output
    assert not (cupid_home / "servers").exists() or not list((cupid_home / "servers").glob("*.json"))
    refused = CliRunner().invoke(
        app, ["nightly", "--config", str(REPO / "configs/eval/nightly.yaml"), "--dry-run", "--gpus", "0"]
    )
    assert refused.exit_code == 2 and "no GPU is visible" in refused.output


def test_slots_run_side_by_side_each_in_turn_with_its_own_log(tmp_path):
    """What an 8-GPU night does with its slots, here with a stand-in for one candidate's run (the real run,
    servers included, is exercised on CPU by test_night_servers.py, where there is one slot)."""
    import threading

    from rich.console import Console

    from cupid.eval.workflows.nightly import run_slots

    running, overlap, order = set(), [], []
    lock = threading.Lock()

    def run(name, console):
        with lock:
            running.add(name)
            overlap.append(len(running))
        console.print(f"ran {name}")
        time.sleep(0.3)
        with lock:
            running.discard(name)
            order.append(name)
        return {"model": name}

    with open(os.devnull, "w") as devnull:
        entries = run_slots([["a1", "a2"], ["b1"]], run, tmp_path, Console(file=devnull))
    assert sorted(e["model"] for e in entries) == ["a1", "a2", "b1"]
    assert max(overlap) == 2  # two slots at once
    assert order.index("a1") < order.index("a2")  # a slot's candidates in turn
    assert "ran a1" in (tmp_path / "slot-1.log").read_text() and "ran b1" in (tmp_path / "slot-2.log").read_text()


def test_a_judge_served_from_a_profile_keys_the_cache_and_the_run_by_its_weights(tmp_path):
    # A refitted judge exported over the same directory and served under the same name is another judge: its
    # requests miss the old one's cache entries, and the run's identity (what `cupid compare` reads) names the change.
    from cupid.eval.benchmark.rundir import Run, RunIdentity
    from cupid.eval.results.compare import differences
    from cupid.serving.client import Client

    model = tmp_path / "export"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"v1")
    (tmp_path / "serve").mkdir()
    (tmp_path / "serve" / "judge.yaml").write_text(
        f"model: {model}\nserved_name: local-prefmatcher\nport: 8011\ndevice: cpu\n"
    )

    def served() -> tuple[str, str]:
        endpoint = plan_servers({"judge": {}}, [], [], directory=tmp_path / "serve").endpoints["judge"]
        request = Client({"judge": endpoint}).request("judge", [{"role": "user", "content": "hi"}])
        assert request.body()["model"] == "local-prefmatcher" and "revision" not in request.body()  # never sent
        return request.key(), endpoint.identity

    key, identity = served()
    assert served() == (key, identity)  # unchanged weights: tomorrow's night reuses the cache
    time.sleep(0.01)
    (model / "model.safetensors").write_bytes(b"v2, refitted")
    refitted_key, refitted = served()
    assert refitted_key != key and refitted != identity and refitted.startswith("local-prefmatcher@")

    def run(judge: str) -> Run:
        return Run(tmp_path / judge, RunIdentity(data="d", roles={"matcher": judge}), None, [])

    assert differences(run(identity), run(refitted)) == [f"judge matcher: {identity} -> {refitted}"]
