"""What keeps a run's directory sound when several processes, a crash or a full disk meet it: one writer per
directory (a lock), files replaced whole (a temporary file, then a rename) and a full disk reported as such.

The lock is `fcntl.flock` on `<dir>/.lock`: the kernel drops it when its process ends, however it ends, so a
killed run never leaves a lock that blocks the next one; the pid written inside only names the holder, and a holder
that lets go empties it, so a pid found there by the next holder is that of a process that was killed.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cupid.common.config import ConfigError
from cupid.common.processes import alive

LOCK_NAME = ".lock"


def state_dir() -> Path:
    """Project-local state (`.cupid/` under the working directory unless CUPID_HOME says otherwise)."""
    return Path(os.environ.get("CUPID_HOME", ".cupid")).resolve()


def models_dir() -> Path:
    """Where the models this project prepares live (`cupid serve prepare-tiny`), under the state directory."""
    return state_dir() / "models"


PREPARED = "prepared:"  # a model this project prepares (`cupid serve prepare-tiny`), by name: `prepared:NAME`


def prepared_model(model: str) -> str:
    """Where a shipped profile or recipe finds a model the project prepares: `prepared:NAME` is
    `<state>/models/NAME`, under CUPID_HOME wherever the command runs; any other model (a Hub id, a path) as given."""
    if model.startswith(PREPARED):
        return str(models_dir() / model.removeprefix(PREPARED))
    return model


class DirectoryBusy(ConfigError):
    """Another process holds the directory; the message names it."""


class DiskFull(ConfigError):
    """A write found no space; what was written before stays valid and a re-run resumes."""


@contextmanager
def hold(directory: str | Path, say: Callable[[str], None] | None = None) -> Iterator[Path]:
    """Hold `directory` for this process: refuse at once if another process holds it (naming its pid), say so when
    taking over the lock of a process that ended without letting go."""
    directory = Path(directory)
    created = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    held = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = True
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise DirectoryBusy(
                f"{directory} is in use by another run (pid {holder}; lock {path}): "
                "wait for it to end, or choose another directory"
            ) from None
        previous = os.pread(fd, 64, 0).decode(errors="replace").strip()
        if previous.isdigit() and int(previous) != os.getpid() and not alive(int(previous)) and say:
            say(f"{directory}: took over the lock left by pid {previous}, which is no longer running")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        if held:  # let go as a process that ended normally: no pid left for the next holder to take over
            os.ftruncate(fd, 0)
        if created and [p.name for p in directory.iterdir()] == [LOCK_NAME]:  # refused before it wrote: leave no trace
            path.unlink()
            directory.rmdir()
        os.close(fd)  # releases the lock; otherwise the file stays (removing it would race with the next holder)


def read_json(path: Path) -> dict[str, Any]:
    """A run's JSON file (run.json, summary.json, ...): {} where it is absent, an error naming it where it does not
    parse."""
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None


def write_atomic(path: str | Path, text: str | bytes) -> None:
    """Replace `path` whole: a reader, a crash or a full disk sees the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8") if isinstance(text, str) else text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def disk_full(error: BaseException) -> bool:
    """ENOSPC from a file write, or SQLite's own word for it (the request cache)."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return isinstance(error, sqlite3.OperationalError) and "full" in str(error)
