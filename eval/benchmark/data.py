"""CUPID data: the row schema, loading from the Hub or local files, validation and filters.

A row that does not fit the schema is never dropped silently: loading returns it as a `BadRow`
naming the file, the row and the field, and runs report and count it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cupid.common import hub

INSTANCE_TYPES = ("consistent", "contrastive", "changing")
HUB_ID = "kixlab/CUPID"
HUB_SPLIT = "test"
SAMPLE_PATH = Path(str(resources.files(__package__) / "sample" / "cupid_sample.jsonl"))

NonEmpty = Field(min_length=1)


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["user", "assistant"]
    content: str


class Session(BaseModel):
    model_config = ConfigDict(extra="ignore")
    context_factor: str
    contextual_preference: str
    dialogue: list[Message] = NonEmpty


class Instance(BaseModel):
    """One benchmark row. Only `current_request` and the dialogues may reach a candidate model."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    persona_id: str = NonEmpty
    instance_type: Literal["consistent", "contrastive", "changing"]
    current_request: str = NonEmpty
    current_context_factor: str
    current_contextual_preference: str = NonEmpty
    current_checklist: list[str] = NonEmpty
    prior_interactions: list[Session] = NonEmpty

    @property
    def key(self) -> str:
        return f"{self.persona_id}/{self.instance_type}"

    def sessions(self, setting: str) -> list[dict[str, Any]]:
        """The prior sessions a setting shows: all (standard, summary), those holding the current preference (oracle),
        or none (oracle-preference, which shows the preference itself)."""
        if setting == "oracle-preference":
            return []
        sessions = [s.model_dump() for s in self.prior_interactions]
        if setting == "oracle":
            return [s for s in sessions if s["contextual_preference"] == self.current_contextual_preference]
        return sessions


@dataclass(frozen=True)
class BadRow:
    source: str  # file and line/row, or Hub id and row
    key: str | None
    problems: list[str]

    def __str__(self) -> str:
        where = f"{self.source} ({self.key})" if self.key else self.source
        return f"{where}: " + "; ".join(self.problems)


@dataclass(frozen=True)
class Dataset:
    source: str
    instances: list[Instance]
    bad_rows: list[BadRow]

    def filter(self, types: Sequence[str] | None = None, limit: int | None = None) -> Dataset:
        """`limit` keeps the first N instances after the type filter, in data order."""
        kept = [i for i in self.instances if not types or i.instance_type in types]
        if limit is not None:
            kept = kept[:limit]
        return Dataset(self.source, kept, self.bad_rows)


class DataError(ValueError):
    pass


def _row_key(row: Any) -> str | None:
    if isinstance(row, dict) and "persona_id" in row:
        return f"{row.get('persona_id')}/{row.get('instance_type')}"
    return None


def validate_rows(rows: Iterable[tuple[str, Any]], source: str) -> Dataset:
    instances: list[Instance] = []
    bad: list[BadRow] = []
    seen: dict[str, str] = {}
    for where, row in rows:
        if isinstance(row, str):  # the reader could not even parse this row
            bad.append(BadRow(where, None, [row]))
            continue
        try:
            instance = Instance.model_validate(row)
        except ValidationError as e:
            problems = [f"{'.'.join(str(p) for p in err['loc']) or 'row'}: {err['msg']}" for err in e.errors()]
            bad.append(BadRow(where, _row_key(row), problems))
            continue
        if instance.key in seen:
            bad.append(BadRow(where, instance.key, [f"duplicate instance key, first seen at {seen[instance.key]}"]))
            continue
        seen[instance.key] = where
        instances.append(instance)
    return Dataset(source, instances, bad)


def _jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{number}", json.loads(line)
            except json.JSONDecodeError as e:
                yield f"{path}:{number}", f"not valid JSON ({e.msg} at column {e.colno})"


def _json_file_rows(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        yield str(path), f"not valid JSON ({e.msg} at line {e.lineno})"
        return
    if isinstance(data, list):
        for i, row in enumerate(data):
            yield f"{path}[{i}]", row
    else:
        yield str(path), data


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq

    for i, row in enumerate(pq.read_table(path).to_pylist()):
        yield f"{path} row {i}", row


def _local_rows(path: Path) -> Iterator[tuple[str, Any]]:
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".json", ".jsonl", ".parquet"))
        if not files:
            raise DataError(f"{path}: no .json, .jsonl or .parquet files in this directory")
        for file in files:
            yield from _local_rows(file)
    elif path.suffix == ".jsonl":
        yield from _jsonl_rows(path)
    elif path.suffix == ".json":
        yield from _json_file_rows(path)
    elif path.suffix == ".parquet":
        yield from _parquet_rows(path)
    else:
        raise DataError(f"{path}: unsupported data file (expected .jsonl, .json, .parquet or a directory of them)")


def _hub_rows(hub_id: str, split: str) -> Iterator[tuple[str, Any]]:
    if (why := hub.unreachable()) is not None:
        raise DataError(
            f"{hub_id} (split {split}): the Hugging Face Hub is out of reach: {why}. Give a local copy (a .jsonl, "
            ".parquet or directory), or set HF_HUB_OFFLINE=1 to read the datasets cache"
        )
    import datasets

    try:
        rows = datasets.load_dataset(hub_id, split=split)
    except Exception as e:  # noqa: BLE001 (network, auth, missing split: all end the same way for the user)
        raise DataError(f"{hub_id} (split {split}): could not load from the Hugging Face Hub: {e}") from None
    for i, row in enumerate(rows):
        yield f"{hub_id}[{split}] row {i}", row


def local_path(source: str | Path | None) -> Path | None:
    """Where a source's rows are on this machine: the bundled sample (None or "sample"), a file or directory that
    exists; None for anything else (a Hub dataset id, or data still to be made)."""
    path = SAMPLE_PATH if source is None or str(source) == "sample" else Path(source)
    return path if path.exists() else None


def named(source: str | Path | None) -> str:
    """The data as a run records it (`RunIdentity.data`, what `cupid compare` holds fixed between two runs): the
    source as the user named it, and `sample` for the bundled sample however it was reached (its path differs from
    one install to another), so that a CLI run and an imported inspect-ai run of the same data compare as such."""
    path = local_path(source)
    return "sample" if path is not None and path.resolve() == SAMPLE_PATH.resolve() else str(source)


def load(source: str | Path | None = None, split: str = HUB_SPLIT) -> Dataset:
    """A local file or directory if the path exists, else a Hub dataset id; default: the bundled sample."""
    if (path := local_path(source)) is not None:
        rows = _local_rows(path)
        name = str(path)
    elif "/" in str(source) and not str(source).startswith((".", "/")) and Path(str(source)).suffix == "":
        rows = _hub_rows(str(source), split)
        name = f"{source}[{split}]"
    else:
        raise DataError(f"{source}: no such file or directory (nor a Hub dataset id like {HUB_ID})")
    return validate_rows(rows, name)
