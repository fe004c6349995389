"""What is left of a process group after its server stopped: the check reports it (`left_running`), so a server
that leaves an engine process behind is seen. Real processes, started and ended here."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from cupid.common.processes import group_left


def _state(pid: int) -> str:
    """The process's state letter in /proc (R, S, Z, ...)."""
    return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]


def test_every_running_process_of_a_group_is_left_until_the_group_ends():
    leader = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60; wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(group_left(leader.pid)) < 3 and time.monotonic() < deadline:  # sh and its two sleeps
            time.sleep(0.05)
        left = group_left(leader.pid)
        assert leader.pid in left and len(left) == 3, left
        assert all(os.getpgid(pid) == leader.pid for pid in left)
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
    deadline = time.monotonic() + 30
    while group_left(leader.pid) and time.monotonic() < deadline:  # the sleeps are reaped by init, not by us
        time.sleep(0.05)
    assert group_left(leader.pid) == []


def test_a_zombie_of_the_group_is_not_left_running():
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while _state(child.pid) != "Z" and time.monotonic() < deadline:  # dead, not yet reaped: a zombie
            time.sleep(0.05)
        assert _state(child.pid) == "Z"
        os.killpg(child.pid, 0)  # the group still exists, as far as signals go
        assert group_left(child.pid) == []
    finally:
        child.wait()
