"""Request cache: one SQLite file (WAL) keyed by the hash of the canonical request.

A re-run, a resumed crash or tomorrow's nightly never pays twice for the same request, and the file
is the audit log of what was sent and what came back. Several runs share one file at once (WAL: readers
never wait; a writer waits up to BUSY_TIMEOUT_S for another). A file that is not a cache, or a cache of a
newer schema, is refused by name and left as it is: it may be someone's data, never ours to replace.

Every API, config and command spells a cache the same way (`CacheSetting`): a file's path, `default` (the one under
CUPID_HOME, `.cupid/cache.sqlite`), or null / None: no cache at all.
"""

from __future__ import annotations

import json
import sqlite3
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cupid.common.config import ConfigError

# 1: the `responses` table below. Files written before the version was recorded (user_version 0) hold the
# same table and are stamped 1 on open.
SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 60.0
_SQLITE_MAGIC = b"SQLite format 3\x00"

SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    key TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    request TEXT NOT NULL,
    content TEXT NOT NULL,
    finish_reason TEXT,
    usage TEXT,
    latency_s REAL,
    created_at REAL NOT NULL
)
"""
_COLUMNS = ["key", "model", "request", "content", "finish_reason", "usage", "latency_s", "created_at"]


@dataclass(frozen=True)
class Cached:
    content: str
    finish_reason: str | None
    usage: dict[str, Any] | None
    latency_s: float | None


class CacheError(ConfigError):
    """The cache file cannot be used; the message names it and what to do. The file is left untouched."""


def _refuse(path: Path, why: str) -> CacheError:
    return CacheError(
        f"request cache {path}: {why}. It was left as it is: give another file with --cache "
        "(or `cache:` in the config), or move this one aside to start a new cache there"
    )


class Cache:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_file() and self.path.stat().st_size > 0:
            with self.path.open("rb") as f:  # sqlite3 would only say "file is not a database", naming nothing
                if f.read(len(_SQLITE_MAGIC)) != _SQLITE_MAGIC:
                    raise _refuse(self.path, "not a SQLite file (truncated, or another kind of file)")
        # One connection, used from the event loop's thread only; each call is well under a millisecond. The timeout
        # is set at connect so that even switching to WAL waits for another run opening the same file.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_S)
        try:
            version = self._check()  # reads only: a file that is not ours stays byte for byte as it was
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(SCHEMA)
            if version < SCHEMA_VERSION:
                self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except sqlite3.DatabaseError as e:
            self._db.close()
            raise _refuse(self.path, f"unreadable as a cache ({e})") from None
        except CacheError:
            self._db.close()
            raise

    def _check(self) -> int:
        """The file's schema version, once it is known to be a cache this code reads (or an empty file); refuse
        anything else. Version 0 is a cache from before versions were recorded: the same table, stamped on open."""
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        tables = {row[0] for row in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if version > SCHEMA_VERSION:
            raise _refuse(
                self.path,
                f"written by a newer cupid (cache schema {version}; this one reads {SCHEMA_VERSION}): upgrade cupid",
            )
        if tables and "responses" not in tables:
            raise _refuse(
                self.path, f"a SQLite database but not a request cache (its tables: {', '.join(sorted(tables))})"
            )
        if "responses" in tables:
            columns = [row[1] for row in self._db.execute("PRAGMA table_info(responses)")]
            if columns != _COLUMNS:
                raise _refuse(self.path, f"its responses table has columns {columns}, not the cache's {_COLUMNS}")
        return version

    def get(self, key: str) -> Cached | None:
        row = self._db.execute(
            "SELECT content, finish_reason, usage, latency_s FROM responses WHERE key = ?", (key,)
        ).fetchone()
        if row is None:
            return None
        return Cached(row[0], row[1], json.loads(row[2]) if row[2] else None, row[3])

    def put(self, key: str, model: str, request: dict[str, Any], answer: Cached) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                key,
                model,
                json.dumps(request, ensure_ascii=False),
                answer.content,
                answer.finish_reason,
                json.dumps(answer.usage) if answer.usage is not None else None,
                answer.latency_s,
                time.time(),
            ),
        )

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        self._db.close()


DEFAULT = "default"
CacheSetting = str | Path | None
"""A SQLite file's path, `DEFAULT` (`<CUPID_HOME>/cache.sqlite`), or None: no cache."""


def renamed_no_cache(data: Any, where: str) -> Any:
    """A config's old `no_cache: true` as its one spelling now, `cache: null`, with a warning that names it."""
    if isinstance(data, dict) and "no_cache" in data:
        data = dict(data)
        if data.pop("no_cache"):
            data["cache"] = None
        warnings.warn(f"{where}: `no_cache: true` is now `cache: null` (no cache)", FutureWarning, stacklevel=2)
    return data


def cache_path(setting: CacheSetting) -> Path | None:
    """The file a setting names (None: no cache)."""
    if setting is None:
        return None
    if str(setting) == DEFAULT:
        from cupid.common.files import state_dir

        return state_dir() / "cache.sqlite"
    return Path(setting)


def open_cache(setting: CacheSetting) -> Cache | None:
    """The cache a setting names, opened (refused by name when the file is not a cache); None: no cache."""
    path = cache_path(setting)
    return Cache(path) if path is not None else None
