import sqlite3

import pytest

from cupid.serving.cache import SCHEMA_VERSION, Cache, Cached, CacheError
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


@pytest.mark.parametrize(
    "content, why",
    [
        (b"this is my thesis, not a cache\n", "not a SQLite file"),
        (None, "a SQLite database but not a request cache (its tables: notes)"),
        ("newer", "written by a newer cupid (cache schema 2; this one reads 1)"),
    ],
)
def test_a_file_that_is_not_this_cache_is_refused_by_name_and_left_alone(tmp_path, content, why):
    path = tmp_path / "cache.sqlite"
    if content is None:  # another program's SQLite database
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE notes (text TEXT)")
        db.commit()
        db.close()
    elif content == "newer":
        Cache(path).close()
        db = sqlite3.connect(path)
        db.execute("PRAGMA user_version = 2")
        db.close()
    else:
        path.write_bytes(content)
    before = path.read_bytes()
    with pytest.raises(CacheError) as refused:
        Cache(path)
    message = str(refused.value)
    assert str(path) in message and why in message
    assert "--cache" in message and "move this one aside" in message
    assert path.read_bytes() == before  # never deleted, never overwritten


def test_a_truncated_cache_is_refused_by_name(tmp_path):
    path = tmp_path / "cache.sqlite"
    cache = Cache(path)
    for i in range(200):
        cache.put(f"k{i}", "m", {"i": i}, Cached("x" * 100, "stop", None, 0.1))
    cache.close()
    path.write_bytes(path.read_bytes()[:1500])  # the header survives, the pages do not
    with pytest.raises(CacheError, match=f"request cache {path}: unreadable as a cache"):
        Cache(path)


def test_an_unversioned_cache_is_stamped_and_keeps_its_answers(tmp_path):
    """Caches written before the schema version was recorded hold the same table: they are migrated in place."""
    path = tmp_path / "cache.sqlite"
    cache = Cache(path)
    cache.put("k", "m", {}, Cached("kept", "stop", None, None))
    cache.close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 0")
    db.close()
    again = Cache(path)
    assert again.get("k").content == "kept"
    db = sqlite3.connect(path)  # the file as any reader of it sees it
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.close()
