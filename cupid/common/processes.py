"""Whether a process runs: a server's, a lock holder's, what is left of a server's process group after it stopped."""

from __future__ import annotations

import os
from pathlib import Path


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


def group_left(pgid: int) -> list[int]:
    """Processes of a server's process group that still run (zombies waiting to be reaped do not count)."""
    proc = Path("/proc")
    if not proc.is_dir():  # no procfs: the group exists or it does not
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    left = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            left.append(int(entry.name))
    return sorted(left)
