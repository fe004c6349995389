import sqlite3

from cupid.serving.cache import Cache, Cached
from cupid.serving.client import ChatRequest


def test_roundtrip_persists_in_wal_mode(tmp_path):
    path = tmp_path / "cache.sqlite"
    cache = Cache(path)
    request = ChatRequest("m", [{"role": "user", "content": "hi"}], {"temperature": 0.0})
    assert cache.get(request.key()) is None
    cache.put(request.key(), "m", request.body(), Cached("hello", "stop", {"total_tokens": 3}, 0.25))
    cache.close()
    reopened = Cache(path)
    assert reopened.get(request.key()) == Cached("hello", "stop", {"total_tokens": 3}, 0.25)
    assert len(reopened) == 1
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_key_is_canonical():
    a = ChatRequest("m", [{"role": "user", "content": "hi"}], {"temperature": 0.0, "max_tokens": 5})
    b = ChatRequest("m", [{"content": "hi", "role": "user"}], {"max_tokens": 5, "temperature": 0.0})
    assert a.key() == b.key()
    assert a.key() != ChatRequest("m", a.messages, {"temperature": 0.0, "max_tokens": 6}).key()
    assert a.key() != ChatRequest("other", a.messages, a.params).key()
