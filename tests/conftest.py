"""Shared fixtures: the tiny models under real vLLM on CPU, the instant-answer server, a private state directory.

Two models, each test on the smaller that shows what it checks (as vLLM's and TRL's own CI do):
- the tiny random-weight Llama (`random_model_dir`, ~3M parameters, built here by tiny_model.ensure_random): the
  session server's model, for plumbing (serving, nights, faults, resume, tracker, inspect, API, training
  mechanics). Its answers are noise: where a test needs them scored, the endpoint holds them to the task's format,
  whose every pattern ends within the cap (matcher/schemas.py).
- SmolLM2-135M-Instruct (`smol_model_dir`), only where an assertion needs a model that follows instructions; each
  such test says why.

One tiny vLLM server serves the whole run, however many xdist workers it has (`tiny_server`): its controller is a
plugin (tests/plugins/session_server.py), beside the environment every process inherits (plugins/environment.py)
and the order and tier of the collected tests (plugins/collection.py). What test files share besides fixtures is in
tests/helpers.py.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from cupid.serving.servers import lifecycle, probes, profiles, state, tiny_model, watchdog
from tests.helpers import RANDOM_SERVING, REPO, TINY_NAME, running_instant, tiny_lora_rank, write_endpoints

pytest_plugins = ["tests.plugins.session_server", "tests.plugins.environment", "tests.plugins.collection"]


@pytest.fixture(scope="session")
def smol_model_dir() -> Path:
    return tiny_model.ensure(REPO / ".cupid" / "models" / tiny_model.DIR_NAME)


@pytest.fixture(scope="session")
def random_model_dir() -> Path:
    return tiny_model.ensure_random(REPO / ".cupid" / "models" / tiny_model.RANDOM_DIR_NAME)


@pytest.fixture(scope="session")
def session_home() -> Path:
    """The session server's state directory, shared by every worker."""
    from tests.plugins.session_server import shared_dir  # imported once pytest has registered the plugin

    home = shared_dir() / "cupid-home"
    home.mkdir(exist_ok=True)
    return home


@pytest.fixture
def cupid_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("CUPID_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def tiny_profile(random_model_dir):
    """The shipped `tiny` profile (vLLM's CPU build, eager) on the random-weight model (its KV cache and threads sized
    for it, `RANDOM_SERVING`), on the session server's port."""
    shipped = profiles.load("tiny", REPO / "configs" / "serve")
    update = {
        "model": str(random_model_dir),
        "served_name": TINY_NAME,
        "port": int(os.environ["CUPID_TEST_TINY_PORT"]),
        **RANDOM_SERVING,
    }
    return shipped.model_copy(update=update)


@pytest.fixture(scope="session")
def tiny_server(tiny_profile, session_home):
    """The random-weight model behind real vLLM on CPU, from the shipped profile with run-time LoRA loading on: one
    server for the whole run (tests/plugins/session_server.py), tied to the pytest controller."""
    mp = pytest.MonkeyPatch()
    mp.setenv("CUPID_HOME", str(session_home))
    from tests.plugins.session_server import shared_dir, tie_to_controller

    shared = shared_dir()
    with open(shared / "tiny-server.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        record = state.find(tiny_profile.name)
        if record is None or not probes.healthy(record.base_url):
            with pytest.MonkeyPatch.context() as tie:
                tie.setattr(watchdog, "tie", tie_to_controller)  # from its first moment: not to this worker
                record = lifecycle.up(
                    tiny_profile.model_copy(update={"runtime_lora_rank": tiny_lora_rank()}), tied=True
                )
            record.tied_to = int(os.environ["CUPID_TEST_CONTROLLER"])
            record.write()
    yield {"base_url": record.base_url, "model": TINY_NAME, "max_tokens": 64, "max_concurrency": 16, "timeout_s": 900}
    mp.undo()  # the server stays up for the other workers; the controller stops it


@pytest.fixture(scope="session")
def instant_url():
    with running_instant() as url:
        yield url


@pytest.fixture
def flaky_url():
    """An instant server that answers each distinct request with 503 once before answering it."""
    with running_instant("--fail-first", "1") as url:
        yield url


@pytest.fixture
def endpoints(request, tmp_path, instant_url):
    """Run endpoints: the instant server under several names and a paid-style endpoint whose key variable is unset;
    for a test that also asks for `tiny_server`, the session server's model as is (free answers: noise), as a
    prefmatcher-format matcher, and with answer formats enforced (`tinyformat`). The tiny server is not asked for
    here: a test names it itself, which makes it slow (tests/plugins/collection.py), and one that only needs the
    instant server stays in `make check`."""
    tiny = request.getfixturevalue("tiny_server") if "tiny_server" in request.fixturenames else None
    served = {}
    if tiny is not None:
        served = {
            "tiny": tiny,
            "tinymatch": {**tiny, "matcher_prompt": "prefmatcher"},
            "tinyformat": {**tiny, "structured_output": True},
        }
    return write_endpoints(
        tmp_path / "endpoints.yaml",
        instant={"base_url": instant_url, "model": "instant"},
        pm={"base_url": instant_url, "model": "local-prefmatcher"},
        **served,
        paid={"base_url": instant_url, "model": "paid-4o", "api_key_env": "CUPID_TEST_MISSING_KEY"},
    )
