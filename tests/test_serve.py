"""Server lifecycle on the real CPU engine (the tiny model under `transformers serve`), and the offline
executor driven by the real tiny model in-process. Each server start costs seconds: there are four
(the shared session server, a profile through the CLI, a crash, a timeout)."""

import asyncio
import json
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cupid import app
from matcher import schemas
from serving import lifecycle, offline
from serving.cache import Cache
from serving.client import Client, RequestFailed
from serving.config import ConfigError
from serving.endpoints import Endpoint
from serving.engines import ServeError, ServeSpec
from tests.conftest import TINY_NAME, free_port

runner = CliRunner()


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains `text` (to prove a process group is gone)."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    out.append(int(proc.name))
            except OSError:
                continue
    return [pid for pid in out if pid != os.getpid()]


def test_real_tiny_server_answers_and_is_recorded(tiny_server, session_home, monkeypatch):
    monkeypatch.setenv("CUPID_HOME", str(session_home))
    rows = {r["name"]: r for r in lifecycle.status()}
    assert rows[TINY_NAME]["alive"] and rows[TINY_NAME]["healthy"]
    assert rows[TINY_NAME]["base_url"] == tiny_server["base_url"]

    async def ask():
        async with Client({"tiny": Endpoint(**tiny_server)}) as client:
            return await client.chat("tiny", [{"role": "user", "content": "Name one colour."}], max_tokens=8)

    answer = asyncio.run(ask())
    assert answer.content.strip() and answer.usage["completion_tokens"] <= 8


def test_port_taken_names_the_owner(tiny_server, session_home, monkeypatch, tiny_model_dir):
    monkeypatch.setenv("CUPID_HOME", str(session_home))
    port = int(tiny_server["base_url"].rsplit(":", 1)[1].split("/")[0])
    try:
        with pytest.raises(ServeError, match=f"port {port} on 127.0.0.1 is taken by '{TINY_NAME}'"):
            lifecycle.up(ServeSpec(model=str(tiny_model_dir), name="second", port=port))
        with pytest.raises(ServeError, match="already served"):
            lifecycle.up(ServeSpec(model=str(tiny_model_dir), name=TINY_NAME, port=free_port()))
    finally:
        lifecycle.down("second")  # should this ever start despite the taken port, it must not outlive the test


def test_port_taken_by_another_program(cupid_home, tiny_model_dir, tmp_path):
    import socket

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        profile = tmp_path / "busy.yaml"
        profile.write_text(yaml.safe_dump({"engine": "transformers", "model": str(tiny_model_dir), "served_name": "busy", "port": port}))
        result = runner.invoke(app, ["serve", "up", "--profile", str(profile)])
    assert result.exit_code == 1 and f"port {port} on 127.0.0.1 is taken" in result.output
    assert lifecycle.records() == []


def test_missing_model_directory_fails_before_starting(cupid_home, tmp_path):
    with pytest.raises(ServeError, match="model directory .*nope not found"):
        lifecycle.up(ServeSpec(model=str(tmp_path / "nope"), name="x", port=free_port()))
    assert lifecycle.records() == []


def test_server_dying_during_startup_shows_the_log_tail_and_the_likely_cause(cupid_home, tmp_path, tiny_model_dir):
    weightless = tmp_path / "weightless"
    weightless.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (weightless / name).write_bytes((tiny_model_dir / name).read_bytes())
    with pytest.raises(ServeError) as e:
        lifecycle.up(ServeSpec(model=str(weightless), name="weightless", port=free_port(), startup_timeout_s=120))
    message = str(e.value)
    assert "exited with code" in message and "last lines of" in message and "server.log" in message
    assert "likely cause: model not found" in message
    assert "no file named model.safetensors" in message.split("---\n", 1)[1]  # the engine's own words, from its log
    assert lifecycle.records() == []


def test_server_not_answering_in_time_is_stopped_with_its_log(cupid_home, tiny_model_dir):
    served = f"slow-{os.getpid()}"
    with pytest.raises(ServeError, match=r"did not answer within 1s \(stopped it\)[\s\S]*last lines of"):
        lifecycle.up(ServeSpec(model=str(tiny_model_dir), name=served, port=free_port(), startup_timeout_s=1))
    assert lifecycle.records() == [] and processes_mentioning(f"serve {served}") == []


def test_profile_lifecycle_through_the_cli(cupid_home, tiny_model_dir, tmp_path):
    """up -> status -> live endpoint -> logs -> down, for a transformers profile named apart from its served name."""
    port = free_port()
    profile = tmp_path / "tinycopy.yaml"
    profile.write_text(yaml.safe_dump({
        "engine": "transformers", "model": str(tiny_model_dir), "served_name": "org/tiny-copy", "port": port,
    }))  # fmt: skip
    result = runner.invoke(app, ["serve", "up", "--engine", "transformers", "--profile", str(profile), "--timeout", "300"])
    assert result.exit_code == 0, result.output
    assert f"serving 'tinycopy' (org/tiny-copy) at http://127.0.0.1:{port}/v1" in result.output
    try:
        record = lifecycle.find("tinycopy")
        assert record["served_name"] == "org/tiny-copy" and record["engine"] == "transformers"
        status = runner.invoke(app, ["serve", "status"])
        assert "tinycopy" in status.output and "healthy" in status.output

        again = runner.invoke(app, ["serve", "up", "--profile", str(profile)])
        assert again.exit_code == 0 and "'tinycopy' is already served" in again.output

        live = lifecycle.live_endpoints()
        assert live["tinycopy"].model == "org/tiny-copy" and live["tinycopy"].url == f"http://127.0.0.1:{port}/v1"

        async def ask():
            async with Client({"tinycopy": live["tinycopy"]}) as client:
                return await client.chat("tinycopy", [{"role": "user", "content": "Say hello."}], max_tokens=4)

        assert asyncio.run(ask()).usage["completion_tokens"] <= 4
        logs = runner.invoke(app, ["serve", "logs", "tinycopy", "-n", "200"])
        assert logs.exit_code == 0 and "POST /v1/chat/completions" in logs.output
    finally:
        down = runner.invoke(app, ["serve", "down", "tinycopy"])
    assert down.exit_code == 0 and "stopped 'tinycopy'" in down.output
    assert not lifecycle.alive(record["pid"]) and not lifecycle.healthy(record["base_url"])
    assert lifecycle.find("tinycopy") is None and "tinycopy" not in lifecycle.live_endpoints()
    assert runner.invoke(app, ["serve", "down", "tinycopy"]).exit_code == 1


def test_likely_causes():
    assert lifecycle.likely_cause("torch.OutOfMemoryError: CUDA out of memory").startswith("out of memory")
    assert lifecycle.likely_cause("OSError: [Errno 98] Address already in use") == "the port is taken"
    assert lifecycle.likely_cause("ValueError: LoRA rank 64 is greater than max_lora_rank 16.").startswith("a LoRA adapter's rank")
    assert "less free memory" in lifecycle.likely_cause(
        "ValueError: Free memory on device cuda:0 (13.33/22.07 GiB) on startup is less than desired GPU memory utilization (0.9, 19.9 GiB)"
    )
    assert "KV cache does not fit" in lifecycle.likely_cause(
        "ValueError: To serve at least one request with the model's max seq len (32768), (1.75 GiB KV cache is needed, "
        "which is larger than the available KV cache memory (0.65 GiB)."
    )
    assert lifecycle.likely_cause("RuntimeError: Found no NVIDIA driver on your system.") == "no usable CUDA device"
    assert lifecycle.likely_cause("all good") is None


def test_vllm_command_and_refusal_without_cuda(tmp_path, monkeypatch):
    from serving.engines import get_engine

    engine = get_engine("vllm")
    spec = ServeSpec(engine="vllm", model="kixlab/prefmatcher-7b", name="kixlab/prefmatcher-7b", port=8000)
    command = engine.command(spec, tmp_path)
    assert command[1:3] == ["serve", "kixlab/prefmatcher-7b"]
    assert command[command.index("--served-model-name") + 1] == "kixlab/prefmatcher-7b"
    assert command[command.index("--generation-config") + 1] == "vllm"
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(ServeError, match="no CUDA device here.*cupid serve up --engine transformers"):
        engine.preflight(spec)


# --- the offline executor ---------------------------------------------------------------------------


def test_vllm_offline_without_vllm_is_a_clear_config_error():
    pytest.importorskip("pytest")
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    endpoints = {"prefmatcher": Endpoint(base_url="http://localhost:8000/v1", model="kixlab/prefmatcher-7b")}
    with pytest.raises(ConfigError, match=r"needs the `vllm` package, which is not installed: pip install -e '\.\[gpu\]'"):
        offline.open_client("vllm-offline", endpoints)
    with pytest.raises(ConfigError, match="unknown executor 'vllm'.*http, vllm-offline, transformers-offline"):
        offline.open_client("vllm", endpoints)


def test_request_fields_map_to_sampling_params_or_fail_clearly():
    fmt = schemas.matcher("prefmatcher", 3)
    kwargs = offline.sampling_kwargs({"temperature": 0.0, "max_tokens": 512, "seed": 7, "response_format": fmt})
    assert kwargs == {"temperature": 0.0, "max_tokens": 512, "seed": 7, "structured_outputs": {"json": fmt["json_schema"]["schema"]}}
    assert offline.sampling_kwargs({"temperature": 0.0})["max_tokens"] is None  # up to the context length, as a server does
    assert offline.sampling_kwargs({"response_format": {"type": "json_object"}})["structured_outputs"] == {"json_object": True}
    for bad in ({"logprobs": True}, {"n": 2}, {"guided_json": {}}):
        with pytest.raises(RequestFailed) as e:
            offline.sampling_kwargs(bad)
        assert e.value.reason == "unsupported_param" and "--executor http" in e.value.detail


def test_offline_client_batches_dedups_and_shares_the_http_cache(tmp_path, tiny_model_dir):
    """The batching core on the real tiny model in-process (transformers-offline): concurrent requests form one
    batch, duplicates are computed once, answers land in the cache under the keys the HTTP client uses."""
    profiles_dir = tmp_path / "serve"
    profiles_dir.mkdir()
    (profiles_dir / "tiny.yaml").write_text(yaml.safe_dump({
        "engine": "transformers", "model": str(tiny_model_dir), "served_name": TINY_NAME, "port": 8011,
    }))  # fmt: skip
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens: any HTTP attempt would fail
    endpoints = {"tiny": Endpoint(base_url=dead, model=TINY_NAME, max_tokens=4, max_concurrency=16, max_retries=0)}
    cache = Cache(tmp_path / "cache.sqlite")
    questions = [[{"role": "user", "content": f"Name colour number {i}."}] for i in range(4)]
    structured = schemas.matcher("prefmatcher", 2)

    async def offline_run():
        client = offline.open_client("transformers-offline", endpoints, cache, profiles_dir=profiles_dir)
        try:
            jobs = [client.chat("tiny", q) for q in questions + questions[:2]]
            jobs.append(client.chat("tiny", questions[0], response_format=structured))
            answers = await asyncio.gather(*jobs, return_exceptions=True)
            return answers, client.stats, client.batch_sizes
        finally:
            await client.aclose()

    answers, stats, batches = asyncio.run(offline_run())
    assert batches == {str(tiny_model_dir): [5]}  # 4 distinct + the structured one, gathered into one batch
    assert stats.sent == 4 and stats.failed == 1 and stats.cached == 0
    assert [a.content for a in answers[4:6]] == [a.content for a in answers[:2]]  # duplicates: the same computation
    assert all(a.content.strip() and a.usage["completion_tokens"] <= 4 for a in answers[:6])
    assert isinstance(answers[6], RequestFailed) and answers[6].reason == "unsupported_param"
    assert len(cache) == 4

    async def http_rerun():
        async with Client(endpoints, cache) as client:
            again = await asyncio.gather(*[client.chat("tiny", q) for q in questions])
            return again, client.stats

    again, http_stats = asyncio.run(http_rerun())
    assert http_stats.cached == 4 and http_stats.sent == 0
    assert [a.content for a in again] == [a.content for a in answers[:4]]
    cache.close()
