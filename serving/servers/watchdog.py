"""A tied server's watchdog: a small process that stops the server's whole process group once the process that
started it is gone, however that ended (SIGKILL included).
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

# How long a server stopped before it ever answered gets after SIGTERM: it has no requests to finish, and vLLM's
# engine process only notes a SIGTERM that comes while it is being built (loading, KV cache, warm-up) and goes on
# building (vllm/v1/engine/core.py, `run_engine_core`), for tens of seconds on a busy CPU.
STARTING_GRACE_S = 3.0

# Watches a tied server: reads its stdin, a pipe whose other end only the starting process holds, so EOF
# means that process is gone, however it ended (SIGKILL included). Then it stops the server's whole process
# group: vLLM's engine runs in child processes, and a server still starting may not heed SIGTERM at once. The
# starting process writes `ready` into the pipe once the server answers: one that never did gets the starting
# grace (STARTING_GRACE_S, above) before SIGKILL, as `up` gives it.
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


def start_watchdog(pgid: int, stdin: Any, starting_grace_s: float = STARTING_GRACE_S) -> subprocess.Popen:
    """The watchdog of a server's process group, reading `stdin` (a pipe, a FIFO): it stops the group when that
    ends (see WATCHDOG). In a session of its own, so that a signal to its owner's group spares it."""
    return subprocess.Popen(
        [sys.executable, "-c", WATCHDOG, str(pgid), str(starting_grace_s)],
        stdin=stdin,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def tie(pid: int) -> None:
    """Stop the server (its process group) when this process ends."""
    _lifelines[pid] = start_watchdog(pid, subprocess.PIPE).stdin


def answered(pid: int) -> None:
    """Tell a tied server's watchdog it answered: stopped later, it gets the full grace."""
    if lifeline := _lifelines.get(pid):
        lifeline.write(b"ready\n")
        lifeline.flush()


def release(pid: int) -> None:
    """The server was stopped: close its lifeline, so that its watchdog finds the group gone and ends."""
    if lifeline := _lifelines.pop(pid, None):
        lifeline.close()
