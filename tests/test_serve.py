import asyncio
import json
import shutil

import pytest

from serving import lifecycle
from serving.client import Client
from serving.endpoints import Endpoint
from serving.engines import ServeError, ServeSpec
from tests.conftest import TINY_NAME, free_port


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
    with pytest.raises(ServeError, match=f"port {port} on 127.0.0.1 is taken by '{TINY_NAME}'"):
        lifecycle.up(ServeSpec(model=str(tiny_model_dir), name="second", port=port))
    with pytest.raises(ServeError, match="already served"):
        lifecycle.up(ServeSpec(model=str(tiny_model_dir), name=TINY_NAME, port=free_port()))


def test_missing_model_directory_fails_before_starting(cupid_home, tmp_path):
    with pytest.raises(ServeError, match="model directory .*nope not found"):
        lifecycle.up(ServeSpec(model=str(tmp_path / "nope"), name="x", port=free_port()))
    assert lifecycle.records() == []


def test_server_dying_during_startup_shows_the_log_tail(cupid_home, tmp_path, tiny_model_dir):
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    with pytest.raises(ServeError) as e:
        lifecycle.up(ServeSpec(model=str(broken), name="broken", port=free_port(), startup_timeout_s=120))
    message = str(e.value)
    assert "exited with code" in message and "last lines of" in message and "server.log" in message
    log_tail = message.split("---\n", 1)[1]
    assert "Error" in log_tail  # the engine's own complaint, read from its log
    assert lifecycle.records() == []


def test_up_and_down_lifecycle(cupid_home, tiny_model_dir):
    spec = ServeSpec(model=str(tiny_model_dir), name="org/tiny-copy", port=free_port(), startup_timeout_s=300)
    record = lifecycle.up(spec)
    assert lifecycle.healthy(record["base_url"])
    assert lifecycle.find("org/tiny-copy")["pid"] == record["pid"]
    assert lifecycle.down("org/tiny-copy")
    assert not lifecycle.alive(record["pid"])
    assert not lifecycle.healthy(record["base_url"])
    assert lifecycle.find("org/tiny-copy") is None
    assert lifecycle.down("org/tiny-copy") is False


def test_likely_causes():
    assert lifecycle.likely_cause("torch.OutOfMemoryError: CUDA out of memory") .startswith("out of memory")
    assert lifecycle.likely_cause("OSError: [Errno 98] Address already in use") == "the port is taken"
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
    with pytest.raises(ServeError, match="no CUDA device here"):
        engine.preflight(spec)
