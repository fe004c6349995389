"""The controller of the session server: one tiny vLLM server serves the whole run, however many xdist workers it has.

The pytest controller (the process that starts the workers, or the only process without xdist) owns what the workers
share: a directory (CUPID_TEST_SHARED: the server's record and log, its lock, the count of vLLM starts), the server's
port, and a FIFO whose only writer it is. The first worker that needs the server starts it under a file lock
(`tiny_server`, tests/conftest.py); the others find it answering. A watchdog reading that FIFO stops the server when the
controller ends however it ends (killed too), and the controller stops it itself at its end (pytest_unconfigure),
after every worker is done: no worker stops it while another uses it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from cupid.serving.servers import lifecycle, watchdog
from cupid.serving.servers.ports import free_port

SHARED = "CUPID_TEST_SHARED"
_controller: dict = {}  # the controller's own: the shared directory and its end of the FIFO


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


def shared_dir() -> Path:
    """The directory the controller shares with the workers."""
    return Path(os.environ[SHARED])


def tie_to_controller(pid: int) -> None:
    """The server's watchdog (`serving.servers.watchdog`), reading the controller's FIFO instead of a pipe from this
    worker (nothing writes `ready` into it: should the controller die, the session server gets the starting grace before
    SIGKILL). Opened without waiting for a writer: a plain open of a FIFO blocks until one opens it, so a controller
    killed while the server was starting left a worker blocked here and the server untied, running on after the run."""
    fd = os.open(shared_dir() / "controller-alive", os.O_RDONLY | os.O_NONBLOCK)
    os.set_blocking(fd, True)  # the watchdog's reads wait for the controller's end; with no writer they end at once
    with os.fdopen(fd, "rb") as alive:
        watchdog.start_watchdog(pid, alive)
