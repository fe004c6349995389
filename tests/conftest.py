"""Shared fixtures: the real tiny model server, the instant-answer server, a private state directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from serving import lifecycle, tiny_model
from serving.engines import ServeSpec
from serving.instant import free_port
from serving.instant import start as start_instant

REPO = Path(__file__).resolve().parents[1]
TINY_NAME = "smollm2-135m-instruct"


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


@pytest.fixture(scope="session")
def instant_url():
    proc, url = start_instant()
    yield url
    proc.terminate()
    proc.wait()


@pytest.fixture
def flaky_url():
    """An instant server that answers each distinct request with 503 once before answering it."""
    proc, url = start_instant("--fail-first", "1")
    yield url
    proc.terminate()
    proc.wait()


@pytest.fixture
def endpoints(tmp_path, instant_url, tiny_server):
    """Run endpoints: the instant server under several names, the real tiny model as is and as a
    prefmatcher-format matcher, and a paid-style endpoint whose key variable is unset."""
    return write_endpoints(
        tmp_path / "endpoints.yaml",
        instant={"base_url": instant_url, "model": "instant"},
        pm={"base_url": instant_url, "model": "local-prefmatcher"},
        tiny=tiny_server,
        tinymatch={**tiny_server, "matcher_prompt": "prefmatcher"},
        paid={"base_url": instant_url, "model": "paid-4o", "api_key_env": "CUPID_TEST_MISSING_KEY"},
    )
