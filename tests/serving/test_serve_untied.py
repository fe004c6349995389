"""`cupid serve up` as a user runs it: the server outlives the command that started it, until `cupid serve down`.

The suite ties every server it starts to its own process (CUPID_TIE_SERVERS=1, tests/conftest.py); this test starts
one without that tie, in a command of its own, and stops it in a `finally` (by its process group where `down` could
not), so that none outlives the suite.
"""

from __future__ import annotations

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

from tests.conftest import free_port, running_in_group

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


def test_an_untied_serve_up_outlives_its_command_until_serve_down(tiny_profile, cupid_home, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    profile = tmp_path / "untied.yaml"  # the shipped tiny profile on the random-weight model, on a port of its own
    fields = tiny_profile.model_dump(exclude_unset=True, exclude={"name"})
    profile.write_text(yaml.safe_dump({**fields, "port": port}))
    env = {k: v for k, v in os.environ.items() if k != "CUPID_TIE_SERVERS"}
    env |= {"CUPID_HOME": str(cupid_home), "COLUMNS": "250"}  # a table row on one line
    pid = None
    tree: list[int] = []
    try:
        up = _cupid(env, tmp_path, "serve", "up", "--profile", str(profile), timeout=600)
        assert up.returncode == 0, up.stdout + up.stderr
        served = re.search(rf"serving 'untied' \(tiny-random-llama\) at {re.escape(url)} \(pid (\d+)\)", up.stdout)
        assert served, up.stdout
        pid = int(served.group(1))
        # The command has returned (its process is gone); a tied server's watchdog would be stopping it now
        time.sleep(5)
        tree = running_in_group(pid)
        assert pid in tree and len(tree) >= 2, tree  # the API server and vLLM's engine process
        assert _answers(url) == ["tiny-random-llama"]

        status = _cupid(env, tmp_path, "serve", "status")
        assert status.returncode == 0, status.stdout + status.stderr
        (row,) = [line for line in status.stdout.splitlines() if "untied" in line]
        cells = [c.strip() for c in row.strip("│ ").split("│")]
        assert cells[:6] == ["untied", "tiny-random-llama", "vllm", url, str(pid), "healthy"], row

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
