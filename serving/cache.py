"""Request cache: one SQLite file (WAL) keyed by the hash of the canonical request.

A re-run, a resumed crash or tomorrow's nightly never pays twice for the same request, and the file
is the audit log of what was sent and what came back.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@dataclass(frozen=True)
class Cached:
    content: str
    finish_reason: str | None
    usage: dict[str, Any] | None
    latency_s: float | None


class Cache:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # One connection, used from the event loop's thread only; each call is well under a millisecond.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=10000")
        self._db.execute(SCHEMA)

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
