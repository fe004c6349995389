"""Start, find and stop local model servers, whatever their engine.

Each server runs in its own process group with its log in a file, and leaves a record in the state directory
(`serving.servers.state`) so that `down`, `status`, `logs` and evaluation runs find it by name. Its parts: the records
(`state`), ports (`ports`), whether it runs and answers (`probes`), what its log says of a failed start
(`server_log`), the watchdog of a tied server (`watchdog`), adapters loaded at run time (`lora`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from cupid.common.errors import ServeError
from cupid.common.processes import alive
from cupid.serving.endpoint import Endpoint
from cupid.serving.servers import watchdog
from cupid.serving.servers.engines import Engine, capabilities, get_engine
from cupid.serving.servers.ports import port_free, taken
from cupid.serving.servers.probes import group_alive, healthy, ready
from cupid.serving.servers.profiles import Profile
from cupid.serving.servers.server_log import startup_failure
from cupid.serving.servers.state import ServerRecord, ServerStatus, find, record_path, records, server_dir
from cupid.serving.servers.vllm_args import engine_env

# A headless node has no API to ask: running this long without exiting counts as started (its engines then
# join the head node, whose own readiness says when the whole server answers).
HEADLESS_SETTLE_S = 5.0

# A process whose servers must never outlive it (a CI script, the test suite and its workers) sets this variable to
# 1: every `up` in it, and in the processes it starts, is then `tied`.
TIE_ENV = "CUPID_TIE_SERVERS"

# Counted work: where this variable names a file, every vLLM engine start (a server, or an offline engine in
# this process) appends a line to it, so a test run can say how many it paid for (tests/plugins/session_server.py
# prints them).
STARTS_ENV = "CUPID_VLLM_STARTS"


def count_vllm_start(what: str) -> None:
    if path := os.environ.get(STARTS_ENV):
        with open(path, "a", encoding="utf-8") as sink:  # one short append per line: whole lines from many processes
            sink.write(f"{what}\n")


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
        raise ServeError(taken(profile.host, profile.port, owner))
    engine.preflight(profile)
    # As served: its local paths absolute, so the record means the same from any directory, and its served name as
    # given (`served` defaults to the model as written, which the clients of this profile ask for).
    profile = profile.model_copy(
        update={"model": profile.model_path(), "lora_adapters": profile.adapter_paths(), "served_name": profile.served}
    )
    process, record = _launch(profile, engine, env or {}, tied)
    return _await_ready(record, process, engine, cancel)


def _launch(
    profile: Profile, engine: Engine, env: dict[str, str], tied: bool
) -> tuple[subprocess.Popen[bytes], ServerRecord]:
    """The server's process, started in its own session with its log, and its record written."""
    name = profile.handle
    workdir = server_dir(name)
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "server.log"
    engine.prepare(profile, workdir)
    command = engine.command(profile, workdir)
    environment = {**engine_env(profile), **env}
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
        watchdog.tie(process.pid)
    if engine.imports_vllm:
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
    return process, record


def _await_ready(
    record: ServerRecord, process: subprocess.Popen[bytes], engine: Engine, cancel: threading.Event | None
) -> ServerRecord:
    """The record once the server answers (a headless node: once it has run HEADLESS_SETTLE_S); the server stopped
    and a ServeError with its log's tail when it exits, does not answer in time, or is cancelled."""
    profile, name, log_path = record.profile, record.profile.handle, Path(record.log)
    timeout = profile.startup_timeout_s
    deadline = time.monotonic() + timeout
    settled = time.monotonic() + min(HEADLESS_SETTLE_S, timeout / 2)
    while time.monotonic() < deadline:
        if cancel is not None and cancel.is_set():
            down(name, grace_s=watchdog.STARTING_GRACE_S)
            raise ServeError(f"'{name}': start cancelled (stopped it)")
        if process.poll() is not None:
            record_path(name).unlink(missing_ok=True)
            raise startup_failure(profile, log_path, f"server exited with code {process.returncode} during start-up")
        if (time.monotonic() >= settled) if profile.headless else ready(profile, engine):
            watchdog.answered(process.pid)
            return record
        time.sleep(0.2)
    down(name, grace_s=watchdog.STARTING_GRACE_S)
    raise startup_failure(profile, log_path, f"server did not answer within {timeout:g}s (stopped it)")


def down(name: str, grace_s: float = 20.0) -> bool:
    """Stop a server's whole process group and wait until none of it runs; False when there was nothing to stop."""
    record = find(name)
    if record is None:
        return False
    pgid = record.pid  # started in its own session: its pid is its group's id
    if group_alive(pgid):
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace_s
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if group_alive(pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            while group_alive(pgid) and time.monotonic() < deadline + 10:
                time.sleep(0.2)
    watchdog.release(pgid)
    record_path(name).unlink(missing_ok=True)
    return True


def status() -> list[ServerStatus]:
    out = []
    for record in records():
        running = alive(record.pid)
        answers = running and (record.profile.headless or healthy(record.base_url))  # headless: no API to ask
        out.append(ServerStatus(**dict(record), alive=running, healthy=answers))
    return out


def endpoint_fields(base_url: str, engine: str, api_key_env: str | None) -> dict[str, Any]:
    """How a client talks to a server this project starts: a running one (`live_endpoints`) or one a run brings."""
    return {
        "base_url": base_url,
        "api_key_env": api_key_env,
        "max_concurrency": capabilities(engine).live_concurrency,
        "structured_output": capabilities(engine).structured_output,  # answer formats a server ignores are parsed
    }


NOTICES = "notices"  # a server's file of the notices said about it (`first_notice`)


def first_notice(url: str, line: str) -> bool:
    """Whether `line`, a notice about the server this project runs at `url`, is new for that server (remembered
    beside its log from now on): a run says which server it used the first time, not on every run. A server started
    again is a new server; a URL no server of this project's answers at is always new."""
    server = next((r for r in records() if r.base_url.rstrip("/") == url.rstrip("/")), None)
    if server is None:
        return True
    path = server_dir(server.name) / NOTICES
    said = f"{server.started_at}\t{server.pid}\t{line}"
    try:
        if said in path.read_text().splitlines():
            return False
    except OSError:
        pass
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(said + "\n")
    except OSError:
        pass  # a notice said again is better than one lost
    return True


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
