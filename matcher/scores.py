"""Preference-match scores (paper §2.3): label scores, per-instance P/R/F1, micro and macro aggregates.

Micro is what the reference code computed the published numbers with (sums over all instances);
macro is what the paper's text describes (mean of per-instance scores). Both are reported.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from statistics import fmean

LABEL_SCORES = {"Fully Covered": 1.0, "Partially Covered": 0.5, "Not Covered": 0.0}


@dataclass(frozen=True)
class PRF:
    precision: float
    recall: float
    f1: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def f1(precision: float, recall: float) -> float:
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


def _ratio(matched: float, total: int) -> float:
    return matched / total if total > 0 else 0.0


@dataclass(frozen=True)
class MatchCounts:
    """Matched mass and item counts of one instance, both directions."""

    predicted_matched: float  # sum of label scores of the inferred checklist against the true preference
    n_predicted: int
    true_matched: float  # sum of label scores of the true checklist against the inferred preference
    n_true: int

    @classmethod
    def from_labels(cls, infer_to_gt: Sequence[str], gt_to_infer: Sequence[str]) -> MatchCounts:
        return cls(
            predicted_matched=sum(LABEL_SCORES[label] for label in infer_to_gt),
            n_predicted=len(infer_to_gt),
            true_matched=sum(LABEL_SCORES[label] for label in gt_to_infer),
            n_true=len(gt_to_infer),
        )

    def prf(self) -> PRF:
        precision = _ratio(self.predicted_matched, self.n_predicted)
        recall = _ratio(self.true_matched, self.n_true)
        return PRF(precision, recall, f1(precision, recall))


def micro(counts: Iterable[MatchCounts]) -> PRF | None:
    counts = list(counts)
    if not counts:
        return None
    precision = _ratio(sum(c.predicted_matched for c in counts), sum(c.n_predicted for c in counts))
    recall = _ratio(sum(c.true_matched for c in counts), sum(c.n_true for c in counts))
    return PRF(precision, recall, f1(precision, recall))


def macro(counts: Iterable[MatchCounts]) -> PRF | None:
    scores = [c.prf() for c in counts]
    if not scores:
        return None
    return PRF(
        fmean(s.precision for s in scores),
        fmean(s.recall for s in scores),
        fmean(s.f1 for s in scores),
    )
