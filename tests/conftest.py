"""Shared fixtures: the real tiny model under vLLM on CPU, the instant-answer server, a private state directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cupid.serving import lifecycle, profiles, tiny_model
from cupid.serving.instant import free_port
from cupid.serving.instant import start as start_instant

REPO = Path(__file__).resolve().parents[1]
lifecycle.tie_servers = True  # every server a test starts dies with this process, even when it is killed
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
def tiny_profile(tiny_model_dir):
    """The shipped `tiny` profile (vLLM's CPU build, eager), on the test model directory and a free port."""
    shipped = profiles.load("tiny", REPO / "configs" / "serve")
    return shipped.model_copy(update={"model": str(tiny_model_dir), "port": free_port()})


@pytest.fixture(scope="session")
def tiny_server(tiny_profile, session_home):
    """The real tiny model behind real vLLM on CPU, started once for the whole session from the shipped
    profile, and tied to this process: a killed test run leaves no server behind."""
    mp = pytest.MonkeyPatch()
    mp.setenv("CUPID_HOME", str(session_home))
    record = lifecycle.up(tiny_profile.spec(), tied=True)
    yield {"base_url": record["base_url"], "model": TINY_NAME, "max_tokens": 64, "max_concurrency": 16, "timeout_s": 900}
    lifecycle.down(tiny_profile.name)
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
    """Run endpoints: the instant server under several names, the real tiny model as is (free answers), as a
    prefmatcher-format matcher, and with answer formats enforced (`tinyformat`), and a paid-style endpoint
    whose key variable is unset."""
    return write_endpoints(
        tmp_path / "endpoints.yaml",
        instant={"base_url": instant_url, "model": "instant"},
        pm={"base_url": instant_url, "model": "local-prefmatcher"},
        tiny=tiny_server,
        tinymatch={**tiny_server, "matcher_prompt": "prefmatcher"},
        tinyformat={**tiny_server, "structured_output": True},
        paid={"base_url": instant_url, "model": "paid-4o", "api_key_env": "CUPID_TEST_MISSING_KEY"},
    )
