"""A unit's record: what one (instance, task, setting) came to, as one line of `instances.jsonl`.

The line is the record's JSON with unset fields left out, so the file stays readable with `jq` and keeps
the shape it always had. Reading is lenient about fields this version does not know (an older or newer
writer) and keeps them; a line that is not a record is named by file and line.

A `Scoring` is what one set of judges made of one candidate answer; a `UnitRecord` is a scoring plus the
unit it belongs to, the ground truth shown to the judges, the candidate's answer, and, under
`--reference`, the reference judges' scoring of the same answer.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from cupid.matcher.parse import MatchItem
from cupid.matcher.scores import PRF, MatchCounts

Status = Literal["scored", "failed"]
Direction = Literal["infer_to_gt", "gt_to_infer"]
DIRECTIONS: tuple[Direction, Direction] = ("infer_to_gt", "gt_to_infer")


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")

    def to_json(self) -> str:
        return self.model_dump_json(exclude_none=True)


class StageError(_Model):
    """Why a unit failed: the stage, the reason (`request_failed`, `parse_error`, ...), its detail, and the
    raw answer that did not parse, where there was one."""

    stage: str
    reason: str
    detail: str
    raw: str | None = None


class Scoring(_Model):
    """One scoring of a candidate answer, filled stage by stage: a failure keeps what came before it.

    Inference: the parsed preference, its checklist (and the decomposer's raw answer), both match
    directions (and the matcher's raw answers), the counts and P/R/F1. Generation: the judge's answer and
    its score."""

    status: Status = "failed"
    error: StageError | None = None
    inferred_preference: str | None = None
    decomposer_answer: str | None = None
    inferred_checklist: list[str] | None = None
    matcher_answers: dict[Direction, str] | None = None
    infer_to_gt: list[MatchItem] | None = None
    gt_to_infer: list[MatchItem] | None = None
    counts: MatchCounts | None = None  # the matcher's own result types, kept as they are (one set of types)
    scores: PRF | None = None
    judge_answer: str | None = None
    score: int | None = None

    @property
    def scored(self) -> bool:
        return self.status == "scored"

    def match_counts(self) -> MatchCounts:
        """A scored inference scoring's counts, for the aggregates."""
        assert self.counts is not None, "an inference scoring that was scored has counts"
        return self.counts


class Labels(_Model):
    """The matcher's labels of one (preference, checklist) pair of a batch (`PrefMatcher.labels_batch`): the items in
    checklist order, or, failed, why. What a batch gives for each item, as `Scoring` is for `score_batch`."""

    status: Status = "failed"
    error: StageError | None = None
    items: list[MatchItem] | None = None

    @property
    def scored(self) -> bool:
        return self.status == "scored"


class _Unit(_Model):
    """The unit a record belongs to and what its judges were shown; declared apart from `Scoring` only so
    that a line of `instances.jsonl` starts with them (pydantic orders fields base class first)."""

    key: str
    persona_id: str
    instance_type: str
    task: str
    setting: str
    n_sessions: int | None = None
    relevant_sessions: list[int] | None = None
    gt_preference: str | None = None
    gt_checklist: list[str] | None = None
    candidate_answer: str | None = None


class UnitRecord(Scoring, _Unit):
    reference: Scoring | None = None

    @property
    def unit(self) -> tuple[str, str, str]:
        """(instance key, task, setting): what a run holds one latest record of."""
        return (self.key, self.task, self.setting)

    def scoring(self, reference: bool = False) -> Scoring:
        """The main scoring, or the reference's; a unit whose candidate failed failed for both scorings."""
        if not reference:
            return self
        return self.reference or Scoring(status="failed", error=self.error)


class RecordError(ValueError):
    pass


def parse_line(line: str, where: str) -> UnitRecord:
    """One line of `instances.jsonl`; `where` names the file and line in the error."""
    try:
        return UnitRecord.model_validate_json(line)
    except ValidationError as e:
        fields = "; ".join(f"{'.'.join(map(str, err['loc'])) or '(line)'}: {err['msg']}" for err in e.errors()[:3])
        raise RecordError(f"{where}: not a unit record ({fields})") from None
