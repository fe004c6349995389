"""Bootstrap confidence intervals over instances.

The instance is the unit of resampling: a score's uncertainty comes from which instances the
benchmark happens to hold, so each resample draws n instances with replacement and recomputes the
aggregate exactly as the summary does (micro: ratios of sums over instances; macro: mean of
per-instance scores; generation: mean judge score). Only scored instances enter; a failed one is
counted elsewhere, never resampled as a zero.

Percentile intervals from a fixed seed, over the instances in a canonical (sorted) order: the same
instances give the same interval whatever order the run wrote them in, which the nightly comparison
relies on. A resample is a vector of multinomial counts (how often each instance
was drawn), so every statistic of a resample is one matrix product.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from cupid.matcher.scores import MatchCounts, macro, micro

N_RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 0
PRF_NAMES = ("precision", "recall", "f1")


@dataclass(frozen=True)
class Interval:
    """A point estimate on all instances and its bootstrap interval."""

    estimate: float
    low: float
    high: float
    n: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def _weights(n: int, n_resamples: int, seed: int) -> np.ndarray:
    """(n_resamples, n): how many times each instance was drawn in each resample."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n, np.full(n, 1.0 / n), size=n_resamples).astype(float)


def _bounds(samples: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(samples, [tail, 100 - tail])
    return float(low), float(high)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num/den, 0 where den is 0 (as matcher.scores does for an empty checklist)."""
    return np.divide(num, den, out=np.zeros_like(num, dtype=float), where=den > 0)


def _f1(p: np.ndarray, r: np.ndarray) -> np.ndarray:
    return _ratio(2 * p * r, p + r)


def prf_intervals(
    counts: Sequence[MatchCounts], *, n_resamples: int = N_RESAMPLES, confidence: float = CONFIDENCE, seed: int = SEED
) -> dict[str, dict[str, Interval]] | None:
    """{"micro"|"macro": {"precision"|"recall"|"f1": Interval}} over scored instances; None when there are none."""
    if not counts:
        return None
    counts = sorted(counts, key=lambda c: (c.predicted_matched, c.n_predicted, c.true_matched, c.n_true))
    n = len(counts)
    w = _weights(n, n_resamples, seed)

    sums = w @ np.array([[c.predicted_matched, c.n_predicted, c.true_matched, c.n_true] for c in counts], dtype=float)
    p, r = _ratio(sums[:, 0], sums[:, 1]), _ratio(sums[:, 2], sums[:, 3])
    micro_samples = {"precision": p, "recall": r, "f1": _f1(p, r)}

    per_instance = np.array([[s.precision, s.recall, s.f1] for s in (c.prf() for c in counts)])
    means = w @ per_instance / n
    macro_samples = {name: means[:, i] for i, name in enumerate(PRF_NAMES)}

    result = {}
    for aggregate, estimate, samples in (("micro", micro(counts), micro_samples), ("macro", macro(counts), macro_samples)):
        result[aggregate] = {
            name: Interval(getattr(estimate, name), *_bounds(samples[name], confidence), n) for name in PRF_NAMES
        }
    return result


def mean_interval(
    values: Sequence[float], *, n_resamples: int = N_RESAMPLES, confidence: float = CONFIDENCE, seed: int = SEED
) -> Interval | None:
    """The mean (e.g. of generation judge scores) and its interval; None for no values."""
    if len(values) == 0:
        return None
    x = np.sort(np.asarray(values, dtype=float))
    samples = _weights(len(x), n_resamples, seed) @ x / len(x)
    return Interval(float(x.mean()), *_bounds(samples, confidence), len(x))
