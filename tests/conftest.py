"""Shared fixtures: the tiny models under real vLLM on CPU, the instant-answer server, a private state directory.

Two models, each test on the smaller that shows what it checks (as vLLM's and TRL's own CI do):
- the tiny random-weight Llama (`random_model_dir`, ~3M parameters, built here by tiny_model.ensure_random): the
  session server's model, for plumbing (serving, nights, faults, resume, tracker, inspect, API, training
  mechanics). Its answers are noise: where a test needs them scored, the endpoint holds them to the task's format,
  whose every pattern ends within the cap (matcher/schemas.py).
- SmolLM2-135M-Instruct (`smol_model_dir`), only where an assertion needs a model that follows instructions; each
  such test says why.

One tiny vLLM server serves the whole run, however many xdist workers it has. The pytest controller (the
process that starts the workers, or the only process without xdist) owns what the workers share: a
directory (CUPID_TEST_SHARED: the server's record and log, its lock, the count of vLLM starts), the
server's port, and a FIFO whose only writer it is. The first worker that needs the server starts it under
a file lock; the others find it answering. A watchdog reading that FIFO stops the server when the
controller ends however it ends (killed too), and the controller stops it itself at its end
(pytest_unconfigure), after every worker is done: no worker stops it while another uses it.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from cupid.eval.benchmark import data as cupid_data
from cupid.serving.servers import lifecycle, probes, profiles, state, tiny_model, vllm_args, watchdog
from cupid.serving.servers.instant import start as start_instant
from cupid.serving.servers.ports import free_port

REPO = Path(__file__).resolve().parents[1]
TINY_NAME = "tiny-random-llama"  # the session server's served name
SHARED = "CUPID_TEST_SHARED"
# The shipped tiny profile's KV cache (3 GiB: SmolLM2-135M's 8 full-length requests) holds ~6M tokens of the
# random-weight model (2 layers of 64): 1 GiB still holds ~2M, and each vLLM start of it faults in 2 GiB fewer (~1.7 s
# of a core).
RANDOM_KV_GIB = 1
# Its matrices are 64 wide: a second OpenMP thread only synchronizes with the first. On one (a core reserved, as the
# profile field says), a server of it answered the same requests in the same time for ~30% less CPU, which the suite's
# other worker gets.
RANDOM_RESERVED_CORES = 1
# A serve profile's fields for the random-weight model, in every profile that serves it.
RANDOM_SERVING = {"cpu_kvcache_space_gib": RANDOM_KV_GIB, "cpu_reserved_cores": RANDOM_RESERVED_CORES}
_controller: dict = {}  # the controller's own: the shared directory and its end of the FIFO


@functools.cache
def tiny_lora_rank() -> int:
    """The --max-lora-rank of the session server, which loads LoRA adapters at run time (the training check's, of
    configs/train/tiny.yaml's rank). Asked when first needed, not at import: reading vLLM's ranks imports vLLM (~20 s
    of a core in a fresh install, where it compiles), and the controller imports this module alone, before any
    worker starts."""
    return vllm_args.lora_rank_for(yaml.safe_load((REPO / "configs/train/tiny.yaml").read_text())["lora"]["r"])


def pytest_configure(config):
    if "PYTEST_XDIST_WORKER" in os.environ:
        return  # a worker: it inherited the controller's settings
    shared = Path(tempfile.mkdtemp(prefix="cupid-tests-"))
    os.mkfifo(shared / "controller-alive")
    _controller.update(shared=shared, fifo=os.open(shared / "controller-alive", os.O_RDWR))  # never inherited
    os.environ.update(
        {
            SHARED: str(shared),
            "CUPID_TEST_CONTROLLER": str(os.getpid()),
            "CUPID_TEST_TINY_PORT": str(free_port()),
            lifecycle.STARTS_ENV: str(shared / "vllm-starts"),
            lifecycle.TIE_ENV: "1",  # every server a test starts dies with its process, even when that is killed
        }
    )
    # Two workers, the session server, a training run and a server a test owns compute at once on 2 cores. An
    # OpenMP thread that finds its partner descheduled spins by default (libgomp): two 2-thread torch processes
    # took 12.3 s where one alone took 3.3 s; with passive waits 7.7 s. Inherited by workers, servers, training.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # numpy's OpenBLAS runs its own threads, which spin as well (OMP_WAIT_POLICY is libgomp's): the simulated
    # comparisons (3000 bootstraps of a (2000, 252) @ (252, 8) product) took 23.6 s and 28.8 CPU-s beside one busy
    # process with a thread per core, 13.0 s and 12.4 CPU-s with one thread. Products that small gain nothing from a
    # second thread even alone. torch keeps its own threads (it does not use OpenBLAS).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # glibc maps each allocation over 32 MB afresh and unmaps it when freed, so a training step's logits and gradients
    # fault in new zeroed pages every time: the GPU training check's CPU form spent 11 s of its 36 s of CPU in the
    # kernel, 4.4M page faults. Kept in the heap instead (no size mapped apart, nothing handed back): 4.6 s, 1.5M
    # faults, 6.0 GB of peak memory against 5.3. Read by each process as it starts: workers, servers, training.
    os.environ.setdefault(
        "GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=17179869184"
    )


# With `--dist loadfile` a worker takes a whole file, in this order (the Makefile passes --no-loadscope-reorder): the
# longest first, so that none starts last; the 135M fine-tune (no vLLM) second, beside the file whose first test starts
# the session server, which a file of servers beside it would wait for.
LONGEST_FIRST = (  # by the time each file took in a fresh clone's run (the commit that last ordered them says)
    "test_serve.py",
    "test_training_smol.py",
    "test_night_servers.py",
    "test_training.py",
    "test_gpu_train_check.py",
    "test_bench.py",
    "test_grpo.py",
    "test_gate_level.py",
    "test_serve_untied.py",
    "test_inspect.py",
    "test_readme.py",
    "test_synth.py",
    "test_track.py",
    "test_stats.py",
    "test_api.py",
    "test_compare.py",
    "test_nightly.py",
    "test_types.py",  # one mypy process, ~11 s of one core: unordered, it came last while the other worker idled
    "test_cli_mistakes.py",
    "test_prepare_tiny.py",
)


# A test that uses one of these starts vLLM or trains (or builds a model to): `slow`, left out of `make check`.
SLOW_FIXTURES = {"tiny_server", "tiny_profile", "smol_model_dir", "random_model_dir"}


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order is kept
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(trylast=True)  # after pytest's slowest durations
def pytest_terminal_summary(terminalreporter):
    if not _controller:
        return
    starts = _controller["shared"] / "vllm-starts"
    lines = starts.read_text().splitlines() if starts.exists() else []
    terminalreporter.write_sep("=", f"vLLM starts in this run: {len(lines)}")
    for what, n in sorted({line: lines.count(line) for line in lines}.items()):
        terminalreporter.write_line(f"{n} x {what}")


def pytest_unconfigure(config):
    if not _controller:
        return
    os.environ["CUPID_HOME"] = str(_controller["shared"] / "cupid-home")
    lifecycle.down("tiny")  # the session server, if a worker started one
    os.close(_controller["fifo"])  # its watchdog finds it gone and ends
    shutil.rmtree(_controller["shared"], ignore_errors=True)


def write_endpoints(path: Path, **entries: dict) -> Path:
    path.write_text(yaml.safe_dump(entries))
    return path


def sample_copies(path: Path, copies: int, marked: bool = False) -> Path:
    """The sample's rows `copies` times, each copy's personas renamed: data with enough personas for an interval
    (the sample's 4 give none). `marked`: each request ends with `(case <its persona>)`, so a candidate (the instant
    server's `--no-preference-for`) can answer some personas differently."""
    rows = [json.loads(line) for line in cupid_data.SAMPLE_PATH.read_text().splitlines()]

    def copy(row: dict, n: int) -> dict:
        persona = f"{row['persona_id']}-{n}"
        request = f"{row['current_request']} (case {persona})" if marked else row["current_request"]
        return {**row, "persona_id": persona, "current_request": request}

    path.write_text("".join(json.dumps(copy(row, n)) + "\n" for n in range(copies) for row in rows))
    return path


@pytest.fixture(scope="session")
def smol_model_dir() -> Path:
    return tiny_model.ensure(REPO / ".cupid" / "models" / tiny_model.DIR_NAME)


@pytest.fixture(scope="session")
def random_model_dir() -> Path:
    return tiny_model.ensure_random(REPO / ".cupid" / "models" / tiny_model.RANDOM_DIR_NAME)


@pytest.fixture(scope="session")
def session_home() -> Path:
    """The session server's state directory, shared by every worker."""
    home = Path(os.environ[SHARED]) / "cupid-home"
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


def running_in_group(pgid: int) -> list[int]:
    """Processes of a process group that still run (psutil: independent of the product's own bookkeeping)."""
    import psutil

    out = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


def _tie_to_controller(pid: int) -> None:
    """The server's watchdog (`serving.servers.watchdog`), reading the controller's FIFO instead of a pipe from this
    worker (nothing writes `ready` into it: should the controller die, the session server gets the starting grace before
    SIGKILL). Opened without waiting for a writer: a plain open of a FIFO blocks until one opens it, so a controller
    killed while the server was starting left a worker blocked here and the server untied, running on after the run."""
    fd = os.open(Path(os.environ[SHARED]) / "controller-alive", os.O_RDONLY | os.O_NONBLOCK)
    os.set_blocking(fd, True)  # the watchdog's reads wait for the controller's end; with no writer they end at once
    with os.fdopen(fd, "rb") as alive:
        watchdog.start_watchdog(pid, alive)


@pytest.fixture(scope="session")
def tiny_server(tiny_profile, session_home):
    """The random-weight model behind real vLLM on CPU, from the shipped profile with run-time LoRA loading on: one
    server for the whole run (see the module docstring), tied to the pytest controller."""
    mp = pytest.MonkeyPatch()
    mp.setenv("CUPID_HOME", str(session_home))
    shared = Path(os.environ[SHARED])
    with open(shared / "tiny-server.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        record = state.find(tiny_profile.name)
        if record is None or not probes.healthy(record.base_url):
            with pytest.MonkeyPatch.context() as tie:
                tie.setattr(watchdog, "tie", _tie_to_controller)  # from its first moment: not to this worker
                record = lifecycle.up(
                    tiny_profile.model_copy(update={"runtime_lora_rank": tiny_lora_rank()}), tied=True
                )
            record.tied_to = int(os.environ["CUPID_TEST_CONTROLLER"])
            record.write()
    yield {"base_url": record.base_url, "model": TINY_NAME, "max_tokens": 64, "max_concurrency": 16, "timeout_s": 900}
    mp.undo()  # the server stays up for the other workers; the controller stops it


def heeds_ctrl_c() -> None:
    """`preexec_fn` of a child a test interrupts: as from a terminal. pytest-xdist's workers ignore SIGINT and a child
    inherits that: it would never see the Ctrl-C the test sends, and run to its end."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def running_instant(*args: str) -> Iterator[str]:
    """An instant server with `args` (`cupid.serving.servers.instant`'s options) for the block; its base URL."""
    proc, url = start_instant(*args)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait()


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
def endpoints(tmp_path, instant_url, tiny_server):
    """Run endpoints: the instant server under several names, the session server's model as is (free answers: noise),
    as a prefmatcher-format matcher, and with answer formats enforced (`tinyformat`), and a paid-style endpoint
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
