"""Start, find and stop local model servers, whatever their engine.

Each server runs in its own process group with its log in a file, and leaves a small JSON record in
the state directory so that `down`, `status`, `logs` and evaluation runs find it by name.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cupid.serving.endpoint import Endpoint
from cupid.serving.engines import Engine, get_engine
from cupid.serving.errors import ServeError
from cupid.serving.profiles import AS_SERVED, Profile
from cupid.serving.vllm_args import engine_env

# First match wins: the specific vLLM messages come before the generic ones they contain.
LIKELY_CAUSES = [
    (
        r"less than desired CPU memory utilization",
        (
            "vLLM's CPU build reserves a fraction of RAM unless the KV cache is sized: "
            "set cpu_kvcache_space_gib in the profile"
        ),
    ),
    (
        r"Unknown quantization method",
        (
            "the model's config.json names a quantization vLLM does not know "
            "(a GGUF conversion? `cupid serve prepare-tiny` writes a plain one)"
        ),
    ),
    (
        r"less than desired GPU memory utilization",
        (
            "the GPU has less free memory than the profile's gpu_memory_utilization asks for "
            "(another process holds some: see nvidia-smi)"
        ),
    ),
    (
        (
            r"larger than the available KV cache memory"
            r"|larger than the maximum number of tokens that can be stored in KV cache"
            r"|No available memory for the cache blocks"
        ),
        "the KV cache does not fit: raise gpu_memory_utilization or lower max_model_len",
    ),
    (
        r"out of memory|CUDA error: out of memory|OutOfMemoryError",
        "out of memory: lower the GPU memory fraction or max model length",
    ),
    (r"address already in use|Errno 98", "the port is taken"),
    (r"LoRA rank \d+ (is )?(greater|larger) than|max_lora_rank", "a LoRA adapter's rank is above max_lora_rank"),
    (
        r"No CUDA GPUs|Found no NVIDIA driver|CUDA is not available|libcuda|no kernel image is available",
        "no usable CUDA device",
    ),
    (
        (
            r"Repository Not Found|not a valid model identifier|OSError: .*does not appear to have"
            r"|No such file or directory|is not a local folder|couldn't connect to 'https://huggingface.co'"
            r"|401 Client Error|no file named \S+\.(safetensors|bin)|Cannot find any model weights"
        ),
        "model not found (a Hub id needs network access or a local copy; a local path must exist)",
    ),
]


def state_dir() -> Path:
    """Project-local state (`.cupid/` under the working directory unless CUPID_HOME says otherwise)."""
    return Path(os.environ.get("CUPID_HOME", ".cupid")).resolve()


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "__", name)


def _servers() -> Path:
    path = state_dir() / "servers"
    path.mkdir(parents=True, exist_ok=True)
    return path


def record_path(name: str) -> Path:
    return _servers() / f"{_slug(name)}.json"


def tail(path: str | Path, lines: int = 40) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def likely_cause(log_text: str) -> str | None:
    for pattern, cause in LIKELY_CAUSES:
        if re.search(pattern, log_text, flags=re.IGNORECASE):
            return cause
    return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child (our own, not yet reaped) counts as dead.
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        return waited == 0
    except ChildProcessError:
        return True


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As servers bind (uvicorn sets it): a port whose last server just stopped is free despite TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


# Its own source of randomness: `random`'s is seeded by whatever trains in this process (transformers' set_seed), and
# two processes seeded alike would then pick the same ports, one server starting on the other's.
_PORTS = random.SystemRandom()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing is bound to, for a server started now or later (tests, a training check's server, `make bench`).

    Picked below the kernel's ephemeral range, not by binding port 0: a port the kernel hands out is soon handed out
    again as the local end of some client's connection, and a server started on it minutes later finds it taken."""
    low = _ephemeral_range()[0]
    if low > 10_001:
        for _ in range(100):
            port = _PORTS.randrange(10_000, low)
            if port_free(host, port):
                return port
    with socket.socket() as sock:  # an unusual ephemeral range: take one the kernel hands out
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default; macOS's (49152-65535) is above it too


class ServerRecord(BaseModel):
    """What is kept of a server this project started (`<state>/servers/<name>.json`): the profile as served (any
    override applied, local paths absolute) and what the running adds. How to reach it by name (`cupid eval`,
    `status`) and how to stop it (`down`). Secrets stay out: the key's variable only."""

    model_config = ConfigDict(extra="ignore")  # a record written by another version

    profile: Profile
    env: dict[str, str] = Field(default_factory=dict)  # what this project set in its environment (never a secret)
    pid: int  # its process group's id too: it starts in a session of its own
    tied_to: int | None = None  # the process it lives no longer than
    log: str
    command: list[str] = Field(default_factory=list)
    started_at: float = 0.0

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        """A record of a server started before records held its profile (its fields side by side): still found by
        `status` and stopped by `down`."""
        if isinstance(data, dict) and "profile" not in data and "port" in data:
            fields = ("engine", "model", "served_name", "host", "port", "api_key_env")
            profile = {k: data[k] for k in fields if data.get(k) is not None}
            device = {"device": data["device"]} if data.get("engine") == "vllm" and "device" in data else {}
            return {**data, "profile": {"name": data.get("name", ""), **profile, **device}}
        return data

    @property
    def name(self) -> str:
        return self.profile.handle

    @property
    def served_models(self) -> list[str]:
        """The served name, then each LoRA adapter it was started with."""
        return [self.profile.served, *self.profile.lora_adapters]

    @property
    def base_url(self) -> str:
        return self.profile.base_url

    @property
    def gpu_memory_utilization(self) -> float | None:
        """Its share of the GPU (plans count it against the servers they start); None off the GPU."""
        return self.profile.gpu_memory_utilization if self.profile.on_gpu else None

    def write(self) -> None:
        record_path(self.name).write_text(self.model_dump_json(indent=2))


class ServerStatus(ServerRecord):
    alive: bool  # its process runs
    healthy: bool  # and answers (a headless node: runs)


def _read(path: Path) -> ServerRecord | None:
    try:
        return ServerRecord.model_validate_json(path.read_text(), context={AS_SERVED: True})
    except (OSError, ValidationError):
        return None


def records() -> list[ServerRecord]:
    return [record for path in sorted(_servers().glob("*.json")) if (record := _read(path)) is not None]


def find(name: str) -> ServerRecord | None:
    path = record_path(name)
    return _read(path) if path.is_file() else None


def healthy(
    base_url: str, paths: tuple[str, ...] = ("/health",), timeout: float = 2.0, api_key: str | None = None
) -> bool:
    """Every path (server-absolute, e.g. `/health`, `/v1/models`) answers 200."""
    root = base_url.removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        return all(httpx.get(root + path, timeout=timeout, headers=headers).status_code == 200 for path in paths)
    except httpx.HTTPError:
        return False


def ready(profile: Profile, engine: Engine, timeout: float = 2.0) -> bool:
    """The engine's readiness paths answer and, where the engine lists it, the served model is loaded."""
    key = profile.api_key()
    if not healthy(profile.base_url, engine.ready_paths, timeout, key):
        return False
    if not engine.lists_served_model:
        return True
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        listed = httpx.get(profile.base_url + "/models", timeout=timeout, headers=headers).json()
        return profile.served in {m.get("id") for m in listed.get("data", [])}
    except (httpx.HTTPError, ValueError, AttributeError):
        return False


# A headless node has no API to ask: running this long without exiting counts as started (its engines then
# join the head node, whose own readiness says when the whole server answers).
HEADLESS_SETTLE_S = 5.0

# A process whose servers must never outlive it (a CI script, the test suite and its workers) sets this variable to
# 1: every `up` in it, and in the processes it starts, is then `tied`.
TIE_ENV = "CUPID_TIE_SERVERS"

# How long a server stopped before it ever answered gets after SIGTERM: it has no requests to finish, and vLLM's
# engine process only notes a SIGTERM that comes while it is being built (loading, KV cache, warm-up) and goes on
# building (vllm/v1/engine/core.py, `run_engine_core`), for tens of seconds on a busy CPU.
STARTING_GRACE_S = 3.0

# Watches a tied server: reads its stdin, a pipe whose other end only the starting process holds, so EOF
# means that process is gone, however it ended (SIGKILL included). Then it stops the server's whole process
# group: vLLM's engine runs in child processes, and a server still starting may not heed SIGTERM at once. The
# starting process writes `ready` into the pipe once the server answers: one that never did gets the starting
# grace (STARTING_GRACE_S, above) before SIGKILL, as `up` gives it; a start whose owner was killed while the
# engine loaded took 29 s to the end of the last process with 15 s.
WATCHDOG = """
import os, signal, sys, time
pgid, starting_grace = int(sys.argv[1]), float(sys.argv[2])
answered = b"ready" in sys.stdin.buffer.read()
for sig, grace in ((signal.SIGTERM, 15.0 if answered else starting_grace), (signal.SIGKILL, 10.0)):
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        break
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            sys.exit(0)
        time.sleep(0.2)
"""
_lifelines: dict[int, Any] = {}  # server pid -> the write end of its watchdog's pipe, open while this process lives


# Counted work: where this variable names a file, every vLLM engine start (a server, or an offline engine in
# this process) appends a line to it, so a test run can say how many it paid for (tests/conftest.py prints them).
STARTS_ENV = "CUPID_VLLM_STARTS"


def count_vllm_start(what: str) -> None:
    if path := os.environ.get(STARTS_ENV):
        with open(path, "a", encoding="utf-8") as sink:  # one short append per line: whole lines from many processes
            sink.write(f"{what}\n")


# Adapters loaded into a running vLLM server, without a restart: a profile with `runtime_lora_rank`
# (--enable-lora with a rank and a slot for them, VLLM_ALLOW_RUNTIME_LORA_UPDATING; serving/profiles.py).
def _lora_call(base_url: str, action: str, body: dict[str, Any], api_key: str | None, timeout: float = 120) -> None:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.post(f"{base_url}/{action}_lora_adapter", json=body, headers=headers, timeout=timeout)
    except httpx.HTTPError as e:
        raise ServeError(f"{base_url}: {action}_lora_adapter failed: {e}") from e
    if response.status_code != 200:
        raise ServeError(
            f"{base_url}: {action}_lora_adapter {body['lora_name']!r}: "
            f"HTTP {response.status_code} {response.text[:500]}"
        )


def load_lora(base_url: str, name: str, path: str | Path, api_key: str | None = None) -> None:
    """Load a LoRA adapter into a running vLLM server (one started with a `runtime_lora_rank`); it then answers as
    `name`. In place: loading a name the server already holds (a run stopped before it unloaded) replaces it."""
    _lora_call(base_url, "load", {"lora_name": name, "lora_path": str(path), "load_inplace": True}, api_key)


def unload_lora(base_url: str, name: str, api_key: str | None = None, timeout: float = 120) -> None:
    _lora_call(base_url, "unload", {"lora_name": name}, api_key, timeout)


def start_watchdog(pgid: int, stdin: Any, starting_grace_s: float = STARTING_GRACE_S) -> subprocess.Popen:
    """The watchdog of a server's process group, reading `stdin` (a pipe, a FIFO): it stops the group when that
    ends (see WATCHDOG). In a session of its own, so that a signal to its owner's group spares it."""
    return subprocess.Popen(
        [sys.executable, "-c", WATCHDOG, str(pgid), str(starting_grace_s)], stdin=stdin,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip


def _tie(pid: int) -> None:
    _lifelines[pid] = start_watchdog(pid, subprocess.PIPE).stdin


def up(
    profile: Profile,
    *,
    env: dict[str, str] | None = None,
    tied: bool = False,
    cancel: threading.Event | None = None,
) -> ServerRecord:
    """Start a profile's server and return its record once it answers (a headless node: once it has run
    HEADLESS_SETTLE_S); raise ServeError with the log's tail if not.

    `env`: more environment, beside what the profile sets (a placement's visible GPUs).
    `tied`: the server lives only as long as this process (tests, runs that start their own servers), however
    this process ends; otherwise it outlives the command that started it (`cupid serve up`) until `down`.
    `cancel`: set from another thread, it stops a server still starting (a run interrupted meanwhile)."""
    tied = tied or os.environ.get(TIE_ENV) == "1"
    engine = get_engine(profile.engine)
    name = profile.handle
    existing = find(name)
    if existing and alive(existing.pid):
        raise ServeError(f"'{name}' is already served (pid {existing.pid}, {existing.base_url})")
    if not port_free(profile.host, profile.port):
        owner = next((r.name for r in records() if r.profile.port == profile.port and alive(r.pid)), None)
        raise ServeError(f"port {profile.port} on {profile.host} is taken" + (f" by '{owner}'" if owner else ""))
    engine.preflight(profile)
    # As served: its local paths absolute, so the record means the same from any directory, and its served name as
    # given (`served` defaults to the model as written, which the clients of this profile ask for).
    profile = profile.model_copy(
        update={"model": profile.model_path(), "lora_adapters": profile.adapter_paths(), "served_name": profile.served}
    )

    workdir = _servers() / _slug(name)
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "server.log"
    engine.prepare(profile, workdir)
    command = engine.command(profile, workdir)
    environment = {**engine_env(profile), **(env or {})}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command,
            cwd=workdir,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **environment, **engine.env(profile, workdir)},
        )
    if tied:
        _tie(process.pid)
    if engine.name == "vllm":
        count_vllm_start(f"server {name}")
    record = ServerRecord(
        profile=profile,
        env=environment,
        pid=process.pid,
        tied_to=os.getpid() if tied else None,
        log=str(log_path),
        command=command,
        started_at=time.time(),
    )
    record.write()

    timeout = profile.startup_timeout_s
    deadline = time.monotonic() + timeout
    settled = time.monotonic() + min(HEADLESS_SETTLE_S, timeout / 2)
    while time.monotonic() < deadline:
        if cancel is not None and cancel.is_set():
            down(name, grace_s=STARTING_GRACE_S)
            raise ServeError(f"'{name}': start cancelled (stopped it)")
        if process.poll() is not None:
            record_path(name).unlink(missing_ok=True)
            raise _startup_failure(profile, log_path, f"server exited with code {process.returncode} during start-up")
        if (time.monotonic() >= settled) if profile.headless else ready(profile, engine):
            if lifeline := _lifelines.get(process.pid):
                lifeline.write(b"ready\n")
                lifeline.flush()
            return record
        time.sleep(0.2)
    down(name, grace_s=STARTING_GRACE_S)
    raise _startup_failure(profile, log_path, f"server did not answer within {timeout:g}s (stopped it)")


# An exception's own line, as a traceback or a logged error ends: `SomeError: message`, after vLLM's log prefix.
_RAISED = re.compile(r"^(?:\(.*?\) ERROR .*?\] )?\s*([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")
_WRAPPERS = ("See root cause above", "Engine core initialization failed")


def root_cause(log_text: str) -> str | None:
    """The first exception a log reports, past the wrappers that only point back at it: vLLM's engine
    processes log the real error long before the server's final traceback."""
    for line in log_text.splitlines():
        found = _RAISED.match(line)
        if found and not any(w in line for w in _WRAPPERS):
            return f"{found.group(1)}: {found.group(2).strip()}"
    return None


def _startup_failure(profile: Profile, log_path: Path, what: str) -> ServeError:
    try:
        log_text = log_path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        log_text = ""
    hint = ""
    if first := root_cause(log_text):
        hint += f"\nroot cause: {first}"
    if cause := likely_cause(log_text):
        hint += f"\nlikely cause: {cause}"
    return ServeError(
        f"'{profile.handle}' ({profile.engine}, {profile.model}): {what}{hint}\n"
        f"--- last lines of {log_path} ---\n{tail(log_path)}"
    )


def failure_line(error: BaseException) -> str:
    """A start failure in one line (what happened, root cause, likely cause: the message `_startup_failure`
    writes, without the log's last lines), for tables and records."""
    text = str(error).split("\n--- last lines of", 1)[0]
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def _group_alive(pgid: int) -> bool:
    """Any process of a server's group still running (vLLM's engine processes outlive its API server by a moment)."""
    if alive(pgid):  # also reaps the leader if it is our own zombie
        return True
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def down(name: str, grace_s: float = 20.0) -> bool:
    """Stop a server's whole process group and wait until none of it runs; False when there was nothing to stop."""
    record = find(name)
    if record is None:
        return False
    pgid = record.pid  # started in its own session: its pid is its group's id
    if _group_alive(pgid):
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace_s
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _group_alive(pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            while _group_alive(pgid) and time.monotonic() < deadline + 10:
                time.sleep(0.2)
    if lifeline := _lifelines.pop(pgid, None):
        lifeline.close()  # its watchdog finds the group gone and ends
    record_path(name).unlink(missing_ok=True)
    return True


def status() -> list[ServerStatus]:
    out = []
    for record in records():
        running = alive(record.pid)
        answers = running and (record.profile.headless or healthy(record.base_url))  # headless: no API to ask
        out.append(ServerStatus(**dict(record), alive=running, healthy=answers))
    return out


# What a client may send to a live server at once: vLLM batches hundreds, `transformers serve` on CPU a few.
LIVE_CONCURRENCY = {"vllm": 256, "transformers": 16}


def endpoint_fields(base_url: str, engine: str, api_key_env: str | None) -> dict[str, Any]:
    """How a client talks to a server this project starts: a running one (`live_endpoints`) or one a run brings."""
    return {
        "base_url": base_url,
        "api_key_env": api_key_env,
        "max_concurrency": LIVE_CONCURRENCY.get(engine, 16),
        "structured_output": engine == "vllm",  # vLLM enforces answer formats; transformers ignores them
    }


def live_endpoints() -> dict[str, Endpoint]:
    """Endpoints for the servers answering now, by server name (a profile's name), by served name and by
    each LoRA adapter it serves, so an evaluation can name a running profile without an entry in
    `configs/endpoints.yaml`."""
    out: dict[str, Endpoint] = {}
    for record in status():
        if not record.healthy or record.profile.headless:  # a headless node's engines answer through its head
            continue
        common = endpoint_fields(record.base_url, record.profile.engine, record.profile.api_key_env)
        out[record.name] = Endpoint(model=record.profile.served, **common)
        for name in record.served_models:  # the served name answers too, and each adapter as itself
            out.setdefault(name, Endpoint(model=name, **common))
    return out
