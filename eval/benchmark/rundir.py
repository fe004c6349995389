"""A run's directory, for evaluation and synthesis runs alike.

run.json          what makes the run; a rerun into the directory must be the same run
instances.jsonl   one line per record: an evaluation's unit records (appended as units finish, so a
                  crash can tear the last line; when the run ends, rewritten whole to one line per unit, its
                  latest), a synthesis run's CUPID rows (rewritten whole)
summary.json/.md  an evaluation's figures (`eval.benchmark.summary`), written whole once its records are in
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer

from cupid.common.config import ConfigError, validate
from cupid.common.files import read_json, write_atomic
from cupid.eval.benchmark.records import UnitRecord, parse_line
from cupid.eval.benchmark.settings import SETTINGS
from cupid.eval.benchmark.summary import Summary, markdown


class OutputDir:
    """What evaluation and synthesis runs share: run.json, checked on a rerun, beside instances.jsonl."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.run_file = self.path / "run.json"
        self.records_file = self.path / "instances.jsonl"

    def check_same_run(
        self,
        identity: dict[str, Any],
        *,
        growing: tuple[str, ...] = (),
        latest: tuple[str, ...] = (),
        what: str = "run",
    ) -> None:
        """Refuse to mix two runs in one directory: every part of `identity` must equal run.json's. A part
        named in `growing` is a map a rerun may extend but not change (an evaluation that binds a new role
        by adding the generation task is the same run); run.json then holds the union. A part named in
        `latest` describes this invocation only (an evaluation's plan of units): never compared, replaced."""
        merged = identity
        if self.run_file.exists():
            previous = json.loads(self.run_file.read_text())
            diff = {}
            for part in sorted(previous.keys() | identity.keys()):
                old, new = previous.get(part), identity.get(part)
                if part in latest:
                    continue
                if part in growing:
                    old, new = old or {}, new or {}
                    diff.update({f"{part}.{k}": (old[k], new[k]) for k in old.keys() & new.keys() if old[k] != new[k]})
                    merged = {**merged, part: {**old, **new}}
                elif old != new:
                    diff[part] = (old, new)
            if diff:
                raise ConfigError(f"{self.path} holds another {what} (differs in {diff}); choose another --out")
        write_atomic(self.run_file, json.dumps(merged, indent=2))


class UnitPlan(BaseModel):
    """The units one invocation set out to score (`cupid view`'s progress): instances x each task's settings."""

    n_instances: int
    settings: dict[str, list[str]]  # task -> its settings

    @property
    def n_units(self) -> int:
        return self.n_instances * sum(len(s) for s in self.settings.values())


class RunIdentity(BaseModel):
    """What makes an evaluation run (run.json): a rerun into its directory must be the same run. Written and read
    by `RunDir` only; the nightly, the tracker, the report, the viewer and `compare` read it typed."""

    model_config = ConfigDict(extra="ignore")  # a run.json written by another version

    data: str | None = None
    roles: dict[str, str] = Field(default_factory=dict)  # role -> model id (the candidate's with its answer format)
    prompts: dict[str, str] = Field(default_factory=dict)  # prompt -> version
    plan: UnitPlan | None = None  # this invocation's units: replaced by each rerun, never compared

    @model_serializer(mode="wrap")
    def _stated(self, handler: Any) -> dict[str, Any]:
        """Only what the run states: a run that wrote no run.json is `{}`, as the file it lacks."""
        return {k: v for k, v in handler(self).items() if v not in (None, {})}


@dataclass
class Run:
    """A run directory read back (`RunDir.load`): run.json, summary.json (None until the run finishes) and the
    latest record of each unit. What the report, the viewer and the meta-evaluation read."""

    path: Path
    identity: RunIdentity
    summary: Summary | None
    records: list[UnitRecord]
    label: str = ""

    def role(self, role: str) -> str | None:
        """A role's model: run.json's model id, else summary.json's "name (model)"."""
        return self.identity.roles.get(role) or self.roles.get(role)

    @property
    def roles(self) -> dict[str, str]:
        """Every role as people read it: summary.json's "name (model)", else run.json's model ids."""
        return dict((self.summary.roles if self.summary else None) or self.identity.roles)

    @property
    def candidate(self) -> str:
        return self.role("candidate") or self.path.name

    @property
    def data(self) -> str:
        return str(self.identity.data or (self.summary.data if self.summary else None) or "sample")

    def of(self, task: str, setting: str | None = None) -> list[UnitRecord]:
        return [r for r in self.records if r.task == task and (setting is None or r.setting == setting)]

    def settings(self, task: str) -> list[str]:
        present = {r.setting for r in self.of(task)}
        return [s for s in SETTINGS if s in present] + sorted(present - set(SETTINGS))

    @property
    def has_reference(self) -> bool:
        return any(r.reference is not None for r in self.records)


class RunDir(OutputDir):
    """An evaluation run's directory: unit records appended as units finish, the summary once they are in. The one
    owner of its files' names and of when its summary is stale: readers (the viewer, the tracker, the nightly) ask
    it."""

    def __init__(self, path: str | Path):
        super().__init__(path)
        self.summary_file = self.path / "summary.json"
        self.tables_file = self.path / "summary.md"

    @property
    def has_records(self) -> bool:
        """A run's directory, begun: it holds unit records."""
        return self.records_file.exists()

    def summary_stale(self) -> bool:
        """Records were appended after summary.json (the directory is being re-run): its figures are not the
        records'. A second of slack for file systems that keep coarse times."""
        if not (self.summary_file.exists() and self.records_file.exists()):
            return False
        return self.summary_file.stat().st_mtime + 1 < self.records_file.stat().st_mtime

    def last_written(self) -> float | None:
        """When the records or the summary last changed (what a page derived from them must be newer than)."""
        times = [f.stat().st_mtime for f in (self.records_file, self.summary_file) if f.exists()]
        return max(times) if times else None

    def load(self) -> Run:
        """The run as it stands: every file it has, read once (a directory without records is an error)."""
        if not self.path.is_dir():
            raise ConfigError(f"{self.path}: no such run directory")
        return Run(self.path, self.identity(), self.summary(), self.read())

    def identity(self) -> RunIdentity:
        """run.json read back typed; empty where the run never wrote one."""
        return validate(RunIdentity, read_json(self.run_file), str(self.run_file))

    def claim(self, identity: RunIdentity) -> None:
        """Make this directory the run's, or refuse when it holds another run (`check_same_run`): the roles and
        prompts a rerun adds are the same run (a task added binds new roles), its plan is its own."""
        self.check_same_run(identity.model_dump(), growing=("roles", "prompts"), latest=("plan",))

    def summary(self) -> Summary | None:
        """summary.json read back typed; None where the run has not finished (or never summarized)."""
        data = read_json(self.summary_file)
        if not data:
            return None
        try:
            return Summary.model_validate(data)
        except ValidationError as e:
            where = ".".join(map(str, e.errors()[0]["loc"]))
            raise ConfigError(f"{self.summary_file}: {where}: {e.errors()[0]['msg']}") from None

    def write_summary(self, summary: Summary) -> None:
        """An evaluation's summary, as data and as the tables people read (each replaced whole)."""
        write_atomic(self.summary_file, summary.to_json())
        write_atomic(self.tables_file, markdown(summary))

    def read(self) -> list[UnitRecord]:
        """The latest record of each unit, in order of first appearance, from a directory that must be a
        run's (what readers of finished runs call: no records file is an error, not an empty run)."""
        if not self.records_file.exists():
            raise ConfigError(f"{self.records_file}: no such file (not a run directory?)")
        return list(self.records().values())

    def records(self) -> dict[tuple[str, str, str], UnitRecord]:
        """The latest record of each (instance, task, setting). A line torn by a crash is not JSON and is
        passed over (`append` closed it, so it may stand before later lines); a JSON line that is not a
        record is an error naming its file and line."""
        latest: dict[tuple[str, str, str], UnitRecord] = {}
        if not self.records_file.exists():
            return latest
        for number, line in enumerate(self.records_file.read_text(encoding="utf-8").splitlines(), start=1):
            if not _complete(line):
                continue
            record = parse_line(line, f"{self.records_file}:{number}")
            latest[record.unit] = record
        return latest

    def compact(self) -> None:
        """The records file rewritten whole (a temporary file, then a rename) to one line per unit, its latest, in
        order of first appearance: what a finished run leaves, so a reader of the file (pandas) counts each unit
        once. The append log is the crash-safe form while the run goes; a resume's retried units appended a
        second line each."""
        if not self.records_file.exists():
            return
        latest: dict[tuple[str, str, str], str] = {}
        for number, line in enumerate(self.records_file.read_text(encoding="utf-8").splitlines(), start=1):
            if _complete(line):
                latest[parse_line(line, f"{self.records_file}:{number}").unit] = line
        write_atomic(self.records_file, "".join(line + "\n" for line in latest.values()))

    def append(self) -> IO[str]:
        """The records file opened for appending, after closing any line torn by a crash."""
        self.path.mkdir(parents=True, exist_ok=True)
        sink = self.records_file.open("a+", encoding="utf-8")
        if sink.tell() > 0:
            sink.seek(sink.tell() - 1)
            if sink.read(1) != "\n":
                sink.write("\n")
        return sink


def _complete(line: str) -> bool:
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True
