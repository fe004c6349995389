"""A task's figures as `summary.json` holds them (`TaskBlock`: per setting, overall and by instance type) and the
tables `summary.md` shows them in. Each task declares its own (`Block`, in its module), so the summary reads and
shows any task's block by its declaration: below the task declarations, which the summary sits above."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, Generic, NamedTuple, Self, TypeVar

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from cupid.eval.benchmark.data import INSTANCE_TYPES
from cupid.eval.benchmark.records import Scoring

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
    def of(cls, scorings: list[Scoring], values: dict[str, float]) -> Self:
        """The figures of these scorings: their counts, and the task's statistic's `values` on the scored ones ({}
        for none), each task's in its own fields."""
        raise NotImplementedError

    @staticmethod
    def _counts(scorings: list[Scoring]) -> dict[str, Any]:
        scored = sum(s.scored for s in scorings)
        stages = Counter(s.error.stage for s in scorings if not s.scored and s.error is not None)
        return {"n_scored": scored, "n_failed": len(scorings) - scored, "failed_by_stage": dict(stages)}


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


class Table(NamedTuple):
    title: str
    headers: list[str]
    rows: list[list[str]]


class Block(NamedTuple):
    """How `summary.json` holds a task's block (its figures' class, `.of(scorings)`) and `summary.md` shows it."""

    figures: type[Figures]
    tables: Callable[[str, Any], list[Table]]  # the block's tables, under a title
