"""A task's figures as `summary.json` holds them (`TaskBlock`: per setting, overall and by instance type) and the
tables `summary.md` shows them in. Each task declares its own (`Block`, in `eval.benchmark.tasks`), so the summary
reads and shows any task's block by its declaration: below the task declarations, which the summary sits above."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from statistics import fmean
from typing import Any, Generic, NamedTuple, Self, TypeVar

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from cupid.eval.benchmark.data import INSTANCE_TYPES
from cupid.eval.benchmark.records import Scoring
from cupid.matcher.scores import PRF, macro, micro

GROUPS = ("all", *INSTANCE_TYPES)


class Figures(BaseModel):
    """What every block states: how many units it covers (a failed unit is counted, never averaged in)."""

    n_scored: int
    n_failed: int
    failed_by_stage: dict[str, int] = Field(default_factory=dict)

    @property
    def n(self) -> str:
        """`scored/run`, as the tables show it."""
        return f"{self.n_scored}/{self.n_scored + self.n_failed}"

    @classmethod
    def of(cls, scorings: list[Scoring]) -> Self:
        """The figures of these scorings (each task's own)."""
        raise NotImplementedError

    @staticmethod
    def _counts(scorings: list[Scoring]) -> dict[str, Any]:
        scored = sum(s.scored for s in scorings)
        stages = Counter(s.error.stage for s in scorings if not s.scored and s.error is not None)
        return {"n_scored": scored, "n_failed": len(scorings) - scored, "failed_by_stage": dict(stages)}


class InferenceFigures(Figures):
    micro: PRF | None = None  # sums over instances: the reference code's, the published numbers
    macro: PRF | None = None  # mean of per-instance scores: the paper's text

    @classmethod
    def of(cls, scorings: list[Scoring]) -> Self:
        points = prf(scorings) or {}
        return cls(**cls._counts(scorings), micro=points.get("micro"), macro=points.get("macro"))


class GenerationFigures(Figures):
    mean_score: float | None = None  # the judge's 1-10

    @classmethod
    def of(cls, scorings: list[Scoring]) -> Self:
        scores = [s.score for s in scorings if s.scored and s.score is not None]
        return cls(**cls._counts(scorings), mean_score=round(fmean(scores), 4) if scores else None)


F = TypeVar("F", bound=Figures)


class SettingBlock(BaseModel, Generic[F]):
    """One setting's figures over all its instances (in JSON: beside `by_type`) and by instance type."""

    overall: F
    by_type: dict[str, F]

    @model_validator(mode="before")
    @classmethod
    def _read(cls, data: Any) -> Any:
        if isinstance(data, dict) and "overall" not in data:
            return {"overall": {k: v for k, v in data.items() if k != "by_type"}, "by_type": data.get("by_type", {})}
        return data

    @model_serializer(mode="wrap")
    def _write(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        return {**data.pop("overall"), **data}

    def group(self, name: str) -> F:
        """`all` or an instance type."""
        return self.overall if name == "all" else self.by_type[name]


class TaskBlock(BaseModel, Generic[F]):
    """A task's figures per setting; in JSON the first setting's are also its top level (`setting` names it)."""

    setting: str
    settings: dict[str, SettingBlock[F]]

    @model_validator(mode="before")
    @classmethod
    def _read(cls, data: Any) -> Any:
        return (
            {"setting": data["setting"], "settings": data["settings"]}
            if isinstance(data, dict) and "settings" in data
            else data
        )

    @model_serializer(mode="wrap")
    def _write(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        return {**data["settings"][self.setting], **data}

    @property
    def overall(self) -> F:
        """The first setting's figures over all its instances."""
        return self.settings[self.setting].overall


def prf(scorings: Iterable[Scoring]) -> dict[str, PRF] | None:
    """Micro and macro P/R/F1 over the scored inference scorings (None: none scored): every point figure's one
    computation (`TaskSpec.intervals` gives the same with bootstrap intervals)."""
    counts = [s.match_counts() for s in scorings if s.scored]
    return {"micro": micro(counts), "macro": macro(counts)} if counts else None  # type: ignore[dict-item]


class Table(NamedTuple):
    title: str
    headers: list[str]
    rows: list[list[str]]


def _pct(value: PRF | None, name: str) -> str:
    return f"{100 * getattr(value, name):.1f}" if value else "-"


def inference_tables(title: str, block: TaskBlock[InferenceFigures]) -> list[Table]:
    return [_inference_table(title, block, average) for average in ("micro", "macro")]


def generation_tables(title: str, block: TaskBlock[GenerationFigures]) -> list[Table]:
    return [_generation_table(title, block)]


def _inference_table(title: str, block: TaskBlock[InferenceFigures], average: str) -> Table:
    headers = ["instances"] + [f"{s} {m}" for s in block.settings for m in ("P", "R", "F1", "n")]
    rows = []
    for group in GROUPS:
        cells = [group]
        for setting in block.settings.values():
            figures = setting.group(group)
            cells += [_pct(getattr(figures, average), k) for k in ("precision", "recall", "f1")] + [figures.n]
        rows.append(cells)
    return Table(f"{title}: preference match, {average} (%)", headers, rows)


def _generation_table(title: str, block: TaskBlock[GenerationFigures]) -> Table:
    headers = ["instances"] + [f"{s} {m}" for s in block.settings for m in ("score", "n")]
    rows = []
    for group in GROUPS:
        cells = [group]
        for setting in block.settings.values():
            figures = setting.group(group)
            cells += ["-" if figures.mean_score is None else f"{figures.mean_score:.2f}", figures.n]
        rows.append(cells)
    return Table(f"{title}: preference alignment, judge score 1-10", headers, rows)


class Block(NamedTuple):
    """How `summary.json` holds a task's block (its figures' class, `.of(scorings)`) and `summary.md` shows it."""

    figures: type[Figures]
    tables: Callable[[str, Any], list[Table]]  # the block's tables, under a title
