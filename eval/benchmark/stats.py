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

A run's figure gets a percentile interval; a paired difference gets a t interval on the bootstrap standard
error (df = personas - 1, the plug-in variance rescaled by n/(n-1)), and the two-sided p-value from the same t, so
p < 1 - confidence exactly when the interval excludes 0, and a p-value is continuous: Holm over a family of 86 rows
can reach .05 (a resampling p-value cannot go under 2/(1 + resamples)). With heavy-tailed persona-level changes and
few personas the percentile interval is too narrow (5.7% one-sided false flags at 10 personas for 2.5%); the t
interval keeps the level there (tests/eval/test_stats.py measures it at `MIN_PERSONAS`).

These rows describe. The gate (a headline's REGRESSION) does not rest on them: its test is a betting e-value over
bounded persona-level changes (`eval.benchmark.evalues`), whose level holds by construction for any law of the
changes, sparse ones included, where a bootstrap's follows the sample's skew and a few personas carrying a change
mislead it.

Draws from a fixed seed over the personas in sorted order: the same units give the same interval whatever order a
run wrote them in. Under `MIN_PERSONAS` personas there is no interval and no p-value: their fields are None, in
every file and table, never a number.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from pydantic import BaseModel

N_RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 0
POWER = 0.80  # `detectable` is the difference a comparison finds this often
MIN_PERSONAS = 10  # fewer, and an interval says more about the resampling than about the model
# Fewer, and the gate gives no verdict rather than a pass it has little power for: at 80 personas one test finds a
# drop of about 8-16 F1 points 80% of the time (docs/performance.md), and a family of 80 tests 13-23.
GATE_PERSONAS = 80
GATE_ALPHA = 0.025  # the gate's family-wise level, one-sided: a false REGRESSION among its tests at most this often

Statistic = Callable[[np.ndarray], dict[str, np.ndarray]]
"""Named figures from column sums: an array (..., k) of sums of the units' k columns to arrays (...)."""


@dataclass(frozen=True)
class Interval:
    """A figure on all scored units and its bootstrap interval; `n` units from `personas` personas. Under
    `MIN_PERSONAS` personas `low` and `high` are None: the interval is never published as numbers."""

    estimate: float
    low: float | None
    high: float | None
    n: int
    personas: int = 0

    def as_dict(self) -> dict[str, float | int | None]:
        return asdict(self)

    @property
    def half_width(self) -> float | None:
        return None if self.low is None or self.high is None else (self.high - self.low) / 2

    @property
    def resolved(self) -> bool:
        """Enough personas for the interval to mean something (an older file's interval, without them, has not)."""
        return self.personas >= MIN_PERSONAS and self.low is not None and self.high is not None

    def text(self, scale: float = 1, digits: int = 1) -> str:
        """`41.2 [38.0, 44.1]`, or the estimate and why there is no interval."""
        value = f"{scale * self.estimate:.{digits}f}"
        if not self.resolved or self.low is None or self.high is None:
            return f"{value} (no interval: {self.personas} personas, <{MIN_PERSONAS})"
        return f"{value} [{scale * self.low:.{digits}f}, {scale * self.high:.{digits}f}]"


class Difference(BaseModel):
    """B - A on the units both runs scored, with its paired interval, the two-sided p-value for no difference from
    the same t (p < 1 - confidence exactly when the interval excludes 0; a gate's headline row carries the gate's
    own p instead, `compare.Row`), the bootstrap standard error `se`, and
    `detectable`: the smallest difference found at `POWER` by a test at level (1 - confidence) / `tests` (Bonferroni
    over the test's family; None where the spread is zero). Under `MIN_PERSONAS` personas the interval, p and
    detectable are None."""

    a: float
    b: float
    difference: float
    low: float | None
    high: float | None
    p_value: float | None
    se: float | None = None  # None under `MIN_PERSONAS`, as the interval
    detectable: float | None
    n: int  # matched units
    personas: int
    null: float = 0.0  # the difference tested against (a gate's margin: -margin)

    @property
    def resolved(self) -> bool:
        return self.personas >= MIN_PERSONAS and self.p_value is not None

    @property
    def gated(self) -> bool:
        """Enough personas for the gate to give a verdict on it (`GATE_PERSONAS`)."""
        return self.resolved and self.personas >= GATE_PERSONAS


def detectable(se: float | None, personas: int, tests: int = 1, confidence: float = CONFIDENCE) -> float | None:
    """(t_{1 - alpha / (2 tests)} + t_{POWER}) x se, t with personas - 1 degrees of freedom (the test's own): what a
    two-sided test among `tests` (Holm's first step) finds `POWER` of the time; None for no spread (nothing is learnt
    of the power from identical runs) and under `MIN_PERSONAS`."""
    if se is None or se <= 0 or personas < MIN_PERSONAS:
        return None
    df = personas - 1
    return (_t_quantile(1 - (1 - confidence) / (2 * tests), df) + _t_quantile(POWER, df)) * se


@functools.lru_cache(maxsize=256)
def _t_quantile(q: float, df: int) -> float:
    """Student's t quantile (scipy's ufunc: `scipy.stats.t.ppf` spends each call in argument checks, and a
    comparison asks the same few quantiles for every row)."""
    from scipy.special import stdtrit  # its import is slow: only where a difference is tested

    return float(stdtrit(df, q))


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


def by_persona(personas: Sequence[str] | np.ndarray, *columns: np.ndarray) -> tuple[int, list[np.ndarray]]:
    """Each array's rows summed per persona, personas in sorted order: (number of personas, the sums)."""
    names, index = np.unique(np.asarray(personas), return_inverse=True)
    sums = []
    for values in columns:
        out = np.zeros((len(names), values.shape[1]))
        np.add.at(out, index, values)
        sums.append(out)
    return len(names), sums


def point(personas: Sequence[str], values: np.ndarray, statistic: Statistic) -> dict[str, float]:
    """Each figure of `statistic` on the units, as `intervals` estimates it (the same sums in the same order, so
    the summary's figure and the interval's estimate are one number); {} for no units."""
    if len(personas) == 0:
        return {}
    _, (sums,) = by_persona(personas, np.asarray(values, dtype=float))
    return {name: float(value) for name, value in statistic(sums.sum(axis=0)).items()}


def intervals(
    personas: Sequence[str],
    values: np.ndarray,
    statistic: Statistic,
    *,
    n_resamples: int = N_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = SEED,
    min_personas: int = MIN_PERSONAS,
) -> dict[str, Interval]:
    """Each figure of `statistic` on the units (`values`: one row of columns per scored unit, `personas` its
    persona) with its interval (none under `min_personas`); {} for no units."""
    if len(personas) == 0:
        return {}
    n_personas, (sums,) = by_persona(personas, np.asarray(values, dtype=float))
    samples = statistic(_weights(n_personas, n_resamples, seed) @ sums)
    estimates = statistic(sums.sum(axis=0))  # `point`'s, to the bit: summed per persona, then over personas
    out = {}
    for name in estimates:
        low, high = _bounds(samples[name], confidence) if n_personas >= min_personas else (None, None)
        out[name] = Interval(float(estimates[name]), low, high, len(personas), n_personas)
    return out


def paired(
    personas: Sequence[str],
    a: np.ndarray,
    b: np.ndarray,
    statistic: Statistic,
    *,
    n_resamples: int = N_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = SEED,
    tests: int = 1,
) -> dict[str, Difference]:
    """Each figure's B - A on matched units (row i of `a` and of `b` is one unit, of persona `personas[i]`),
    resampling personas with both runs' units together; {} for no units. `tests`: the size of the family the
    difference is tested in (for `detectable`)."""
    if len(personas) == 0:
        return {}
    n_personas, (sums_a, sums_b) = by_persona(personas, np.asarray(a, dtype=float), np.asarray(b, dtype=float))
    weights = _weights(n_personas, n_resamples, seed)
    samples_a, samples_b = statistic(weights @ sums_a), statistic(weights @ sums_b)
    point_a, point_b = statistic(sums_a.sum(axis=0)), statistic(sums_b.sum(axis=0))
    resolved = n_personas >= MIN_PERSONAS
    out = {}
    for name in point_a:
        difference = float(point_b[name] - point_a[name])
        se = _se(samples_b[name] - samples_a[name], n_personas)
        low = high = p = None
        if resolved:
            low, high, p = _t_test(difference, se, n_personas - 1, confidence)
        out[name] = Difference(
            a=float(point_a[name]),
            b=float(point_b[name]),
            difference=difference,
            low=low,
            high=high,
            p_value=p,
            se=se if resolved else None,
            detectable=detectable(se, n_personas, tests, confidence) if resolved else None,
            n=len(personas),
            personas=n_personas,
        )
    return out


def _se(samples: np.ndarray, n_personas: int) -> float:
    """The bootstrap's standard error, its plug-in variance rescaled by n/(n-1) (the unbiased one's for a mean);
    0 below a rounding error of the figure, so that identical runs have no spread at all."""
    se = float(samples.std(ddof=1) * np.sqrt(n_personas / max(n_personas - 1, 1))) if len(samples) > 1 else 0.0
    return se if se > 1e-12 else 0.0


def _t_test(difference: float, se: float, df: int, confidence: float) -> tuple[float, float, float]:
    """The t interval and the two-sided p-value for no difference; with no spread, the difference is certain."""
    if se == 0:
        return difference, difference, 1.0 if difference == 0 else 0.0
    from scipy.special import stdtr

    half = _t_quantile(1 - (1 - confidence) / 2, df) * se
    return difference - half, difference + half, float(min(1.0, 2 * stdtr(df, -abs(difference) / se)))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values (family-wise error over the given tests, under any dependence), in the given order.
    Written out rather than taken
    from statsmodels' `multipletests`, whose Holm branch runs a full `gc.collect()` on every call, slow in a process
    holding many objects, once per comparison (a nightly makes dozens); tests/eval/test_stats.py checks the two
    agree."""
    if not p_values:
        return []
    p = np.asarray(p_values, dtype=float)
    order = np.argsort(p, kind="stable")
    stepped = np.minimum(1.0, np.maximum.accumulate(p[order] * np.arange(len(p), 0, -1)))
    adjusted = np.empty_like(stepped)
    adjusted[order] = stepped
    return [float(x) for x in adjusted]


# ---------------------------------------------------------------- what the tasks' statistics are made of


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num/den, 0 where den is 0 (as matcher.scores does for an empty checklist)."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    return np.divide(num, den, out=np.zeros(np.broadcast(num, den).shape), where=den > 0)
