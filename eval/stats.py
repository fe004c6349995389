"""Bootstrap intervals and paired comparisons, resampling personas.

CUPID's instances are clustered: each persona has three (consistent, contrastive, changing) built from the
same sessions, so a model that misreads a persona tends to miss all three. The persona is therefore the
unit of resampling. A resample draws personas with replacement and recomputes each figure exactly as the
summary does, as a ratio of sums over the drawn personas' scored units (micro P/R/F1: matched mass over
items; macro: the sum of per-unit scores over the number of units; generation: the sum of judge scores
over their number). A failed unit is counted elsewhere, never resampled as a zero.

A figure is thus a function of column sums (`Statistic`), and a resample is a vector of multinomial
counts over the personas: every figure of every resample is one matrix product. Comparing two runs uses
the same draws for both (a drawn persona brings both runs' units), so the noise the runs share cancels.

Percentile intervals from a fixed seed over the personas in sorted order: the same units give the same
interval whatever order a run wrote them in.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist

import numpy as np
from pydantic import BaseModel

from cupid.matcher.scores import MatchCounts

N_RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 0
POWER = 0.80  # `detectable` is the difference a comparison finds this often
MIN_PERSONAS = 10  # fewer, and a percentile interval says more about the resampling than about the model

Statistic = Callable[[np.ndarray], dict[str, np.ndarray]]
"""Named figures from column sums: an array (..., k) of sums of the units' k columns to arrays (...)."""


@dataclass(frozen=True)
class Interval:
    """A figure on all scored units and its bootstrap interval; `n` units from `personas` personas."""

    estimate: float
    low: float
    high: float
    n: int
    personas: int = 0

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    @property
    def resolved(self) -> bool:
        """Enough personas for the interval to mean something (an older file's interval, without them, has not)."""
        return self.personas >= MIN_PERSONAS

    def text(self, scale: float = 1, digits: int = 1) -> str:
        """`41.2 [38.0, 44.1]`, or the estimate and why there is no interval."""
        value = f"{scale * self.estimate:.{digits}f}"
        if not self.resolved:
            return f"{value} (no interval: {self.personas} personas, <{MIN_PERSONAS})"
        return f"{value} [{scale * self.low:.{digits}f}, {scale * self.high:.{digits}f}]"


class Difference(BaseModel):
    """B - A on the units both runs scored, with its paired interval and a two-sided p-value for no difference
    (the bootstrap's: twice the smaller tail mass at 0, so p < 1 - confidence exactly when the interval
    excludes 0); `detectable` is the smallest difference found at `POWER` with this pair's spread."""

    a: float
    b: float
    difference: float
    low: float
    high: float
    p_value: float
    detectable: float
    n: int  # matched units
    personas: int

    @property
    def resolved(self) -> bool:
        return self.personas >= MIN_PERSONAS


@functools.lru_cache(maxsize=8)
def _weights(n: int, n_resamples: int, seed: int) -> np.ndarray:
    """(n_resamples, n): how many times each persona was drawn in each resample. The same for every figure of
    a run (a nightly asks for dozens), so drawn once; read-only."""
    rng = np.random.default_rng(seed)
    weights = rng.multinomial(n, np.full(n, 1.0 / n), size=n_resamples).astype(float)
    weights.flags.writeable = False
    return weights


def _bounds(samples: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(samples, [tail, 100 - tail])
    return float(low), float(high)


def by_persona(personas: Sequence[str], *columns: np.ndarray) -> tuple[int, list[np.ndarray]]:
    """Each array's rows summed per persona, personas in sorted order: (number of personas, the sums)."""
    names, index = np.unique(np.asarray(personas), return_inverse=True)
    sums = []
    for values in columns:
        out = np.zeros((len(names), values.shape[1]))
        np.add.at(out, index, values)
        sums.append(out)
    return len(names), sums


def intervals(
    personas: Sequence[str],
    values: np.ndarray,
    statistic: Statistic,
    *,
    n_resamples: int = N_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = SEED,
) -> dict[str, Interval]:
    """Each figure of `statistic` on the units (`values`: one row of columns per scored unit, `personas` its
    persona) with its interval; {} for no units."""
    if len(personas) == 0:
        return {}
    n_personas, (sums,) = by_persona(personas, np.asarray(values, dtype=float))
    samples = statistic(_weights(n_personas, n_resamples, seed) @ sums)
    estimates = statistic(sums.sum(axis=0))
    return {
        name: Interval(float(estimates[name]), *_bounds(samples[name], confidence), len(personas), n_personas)
        for name in estimates
    }


def paired(
    personas: Sequence[str],
    a: np.ndarray,
    b: np.ndarray,
    statistic: Statistic,
    *,
    n_resamples: int = N_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = SEED,
) -> dict[str, Difference]:
    """Each figure's B - A on matched units (row i of `a` and of `b` is one unit, of persona `personas[i]`),
    resampling personas with both runs' units together; {} for no units."""
    if len(personas) == 0:
        return {}
    n_personas, (sums_a, sums_b) = by_persona(personas, np.asarray(a, dtype=float), np.asarray(b, dtype=float))
    weights = _weights(n_personas, n_resamples, seed)
    samples_a, samples_b = statistic(weights @ sums_a), statistic(weights @ sums_b)
    point_a, point_b = statistic(sums_a.sum(axis=0)), statistic(sums_b.sum(axis=0))
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2) + NormalDist().inv_cdf(POWER)
    out = {}
    for name in point_a:
        samples = samples_b[name] - samples_a[name]
        tails = min(np.sum(samples <= 0), np.sum(samples >= 0))
        low, high = _bounds(samples, confidence)
        out[name] = Difference(
            a=float(point_a[name]),
            b=float(point_b[name]),
            difference=float(point_b[name] - point_a[name]),
            low=low,
            high=high,
            p_value=min(1.0, 2 * (1 + tails) / (1 + n_resamples)),
            detectable=float(z * samples.std()),
            n=len(personas),
            personas=n_personas,
        )
    return out


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values (family-wise error over the given tests), in the given order."""
    if not p_values:
        return []
    from statsmodels.stats.multitest import multipletests  # its import costs ~1 s: only where p-values are adjusted

    return [float(p) for p in multipletests(list(p_values), method="holm")[1]]


# ---------------------------------------------------------------- the tasks' statistics


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num/den, 0 where den is 0 (as matcher.scores does for an empty checklist)."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    return np.divide(num, den, out=np.zeros(np.broadcast(num, den).shape), where=den > 0)


def _f1(p: np.ndarray, r: np.ndarray) -> np.ndarray:
    return ratio(2 * p * r, p + r)


PRF_COLUMNS = ("predicted_matched", "n_predicted", "true_matched", "n_true", "precision", "recall", "f1", "units")


def prf_row(counts: MatchCounts) -> list[float]:
    """One unit's `PRF_COLUMNS`."""
    scores = counts.prf()
    return [
        counts.predicted_matched,
        counts.n_predicted,
        counts.true_matched,
        counts.n_true,
        scores.precision,
        scores.recall,
        scores.f1,
        1.0,
    ]


def prf(sums: np.ndarray) -> dict[str, np.ndarray]:
    """Micro (ratios of summed counts) and macro (summed per-unit scores over units) P/R/F1, from sums of
    `PRF_COLUMNS`."""
    s = np.asarray(sums, dtype=float)
    p, r = ratio(s[..., 0], s[..., 1]), ratio(s[..., 2], s[..., 3])
    units = s[..., 7]
    return {
        "micro_precision": p,
        "micro_recall": r,
        "micro_f1": _f1(p, r),
        "macro_precision": ratio(s[..., 4], units),
        "macro_recall": ratio(s[..., 5], units),
        "macro_f1": ratio(s[..., 6], units),
    }


def mean_score(sums: np.ndarray) -> dict[str, np.ndarray]:
    """The mean judge score, from sums of (score, 1)."""
    s = np.asarray(sums, dtype=float)
    return {"mean_score": ratio(s[..., 0], s[..., 1])}
