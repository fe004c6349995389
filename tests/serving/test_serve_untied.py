"""`cupid serve` as a user runs it, one vLLM start for the whole life of a server: `up` in a command of its own,
the server outliving that command, `status`, `up` again, the live endpoint a run resolves, a request, `logs`, the GPU
smoke script on the running server, then `down`, which stops the engine processes too.

The suite ties every server it starts to its own process (CUPID_TIE_SERVERS=1, tests/plugins/session_server.py);
this test starts one without that tie, and stops it in a `finally` (by its process group where `down` could not), so
that none outlives the suite.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import yaml

from cupid.serving.client import Client
from cupid.serving.servers import lifecycle
from cupid.serving.servers.ports import free_port
from tests.helpers import REPO, running_in_group

CUPID = [sys.executable, "-m", "cupid"]


def _cupid(env: dict[str, str], cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CUPID, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def _running(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            continue
    return out


def _answers(url: str) -> list[str] | None:
    try:
        response = httpx.get(url + "/models", timeout=10)
    except httpx.TransportError:
        return None
    return [m["id"] for m in response.json()["data"]] if response.status_code == 200 else None


def test_a_served_model_lives_from_up_to_down_across_commands(tiny_profile, cupid_home, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    # the shipped tiny profile on the random-weight model, on a port of its own, named apart from its served name
    profile = tmp_path / "untied.yaml"
    fields = tiny_profile.model_dump(exclude_unset=True, exclude={"name"})
    profile.write_text(yaml.safe_dump({**fields, "served_name": "org/tiny-copy", "port": port}))
    env = {k: v for k, v in os.environ.items() if k != "CUPID_TIE_SERVERS"}
    env |= {"CUPID_HOME": str(cupid_home), "COLUMNS": "250"}  # a table row on one line
    pid = None
    tree: list[int] = []
    try:
        up = _cupid(env, tmp_path, "serve", "up", "--profile", str(profile), timeout=600)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "untied: vllm (cpu) org/tiny-copy" in up.stdout, up.stdout
        served = re.search(rf"serving 'untied' \(org/tiny-copy\) at {re.escape(url)} \(pid (\d+)\)", up.stdout)
        assert served, up.stdout
        pid = int(served.group(1))
        # The command has returned (its process is gone); a tied server's watchdog would be stopping it now
        time.sleep(5)
        tree = running_in_group(pid)
        assert pid in tree and len(tree) >= 2, tree  # the API server and vLLM's engine process
        assert _answers(url) == ["org/tiny-copy"]

        status = _cupid(env, tmp_path, "serve", "status")
        assert status.returncode == 0, status.stdout + status.stderr
        (row,) = [line for line in status.stdout.splitlines() if "untied" in line]
        cells = [c.strip() for c in row.strip("│ ").split("│")]
        assert cells[:6] == ["untied", "org/tiny-copy", "vllm", url, str(pid), "healthy"], row

        again = _cupid(env, tmp_path, "serve", "up", "--profile", str(profile))
        assert again.returncode == 0 and "'untied' is already served" in again.stdout, again.stdout + again.stderr

        live = lifecycle.live_endpoints()  # what a run's role name resolves to first
        assert live["untied"].model == "org/tiny-copy" and live["untied"].url == url
        assert live["untied"].structured_output  # vLLM enforces answer formats

        async def ask():
            async with Client({"untied": live["untied"]}) as client:
                return await client.chat("untied", [{"role": "user", "content": "Say hello."}], max_tokens=4)

        assert asyncio.run(ask()).usage["completion_tokens"] <= 4
        logs = _cupid(env, tmp_path, "serve", "logs", "untied", "-n", "200")
        assert logs.returncode == 0 and "POST /v1/chat/completions" in logs.stdout, logs.stdout + logs.stderr

        smoke = subprocess.run(
            [sys.executable, "scripts/gpu_smoke.py", "--profile", str(profile), "--in-flight", "4", "--min-requests",
             "4", "--max-tokens", "200"],
            cwd=REPO, capture_output=True, text=True, timeout=600, env=env, check=False,
        )  # fmt: skip
        assert smoke.returncode == 0, smoke.stdout + smoke.stderr
        assert "using the running server 'untied'" in smoke.stdout and "OK: the answer parses" in smoke.stdout
        assert re.search(r"4 in flight: +[0-9.]+ requests/s", smoke.stdout)
        assert running_in_group(pid)  # the script leaves a server it did not start running

        down = _cupid(env, tmp_path, "serve", "down", "untied")
        assert down.returncode == 0 and down.stdout.strip() == "stopped 'untied'", down.stdout + down.stderr
        assert _running(tree) == [] and running_in_group(pid) == []  # `down` returns once the whole group is gone
        assert _answers(url) is None
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # the port is free again
        after = _cupid(env, tmp_path, "serve", "status")
        assert after.returncode == 0 and after.stdout.strip() == "no servers", after.stdout
        again = _cupid(env, tmp_path, "serve", "down", "untied")
        assert again.returncode == 2 and "no server named 'untied'" in again.stdout, again.stdout + again.stderr
    finally:
        if pid is None or running_in_group(pid):
            _cupid(env, tmp_path, "serve", "down", "untied")  # by its record, also when `up` failed midway
        if pid is not None and running_in_group(pid):
            os.killpg(pid, signal.SIGKILL)
