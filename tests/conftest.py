"""Shared fixtures: the real tiny model server, the instant-answer server, a private state directory."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from serving import lifecycle, tiny_model
from serving.engines import ServeSpec

REPO = Path(__file__).resolve().parents[1]
TINY_NAME = "smollm2-135m-instruct"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_endpoints(path: Path, **entries: dict) -> Path:
    path.write_text(yaml.safe_dump(entries))
    return path


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    return tiny_model.ensure(REPO / ".cupid" / "models" / tiny_model.DIR_NAME)


@pytest.fixture(scope="session")
def session_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cupid-home")


@pytest.fixture
def cupid_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("CUPID_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def tiny_server(tiny_model_dir, session_home):
    """The real tiny model behind the real `transformers serve`, once for the whole session."""
    mp = pytest.MonkeyPatch()
    mp.setenv("CUPID_HOME", str(session_home))
    spec = ServeSpec(model=str(tiny_model_dir), name=TINY_NAME, port=free_port(), startup_timeout_s=300)
    record = lifecycle.up(spec)
    yield {"base_url": record["base_url"], "model": TINY_NAME, "max_tokens": 64, "max_concurrency": 8, "timeout_s": 900}
    lifecycle.down(TINY_NAME)
    mp.undo()


def _start_instant(*args: str):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "serving.instant", "--port", str(port), *args], cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            if httpx.get(url + "/health").status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    return proc, url + "/v1"


@pytest.fixture(scope="session")
def instant_url():
    proc, url = _start_instant()
    yield url
    proc.terminate()
    proc.wait()


@pytest.fixture
def flaky_url():
    """An instant server that answers each distinct request with 503 once before answering it."""
    proc, url = _start_instant("--fail-first", "1")
    yield url
    proc.terminate()
    proc.wait()
