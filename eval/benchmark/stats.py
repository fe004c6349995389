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

The gate's own test (a headline figure, `paired(..., studentized=True)`) is a studentized bootstrap (bootstrap-t):
each resample's difference is divided by its own standard error (the linearized one: the figure's gradient on the
resample's sums times each drawn persona's sums), and the interval and p-value come from the quantiles of that
t statistic instead of a t law. Real persona-level changes are skewed (a few personas gain or lose a lot), and a
symmetric t interval then flags one side too often (7% one-sided at 10 personas for 2.5%); the studentized
interval follows the skew. No interval at any size holds the level when a tenth of the personas carry the change
and ten personas may hold none of them, so the gate asks `GATE_PERSONAS`, and at that size the studentized interval
still runs about a point over its nominal level on one side: the gate tests at `GATE_CONFIDENCE`
(tests/eval/test_gate_level.py measures the false alarms there, per law, in both directions).

A bootstrap-t p-value from B resamples cannot go under 2/(B + 1), and a Holm family of m tests asks its smallest one
to go under (1 - confidence)/m: at 2,000 resamples a nightly of 36 headline tests could flag nothing. So a family
resolves its p-values (`Difference.resolve`, called by the family's Holm): one the first resamples put near its
floor (fewer than `RESOLVE_TAIL` resamples beyond the observed t) draws further resamples, in rounds that double
their number, until `RESOLVE_TAIL` lie beyond it or its floor is under half the family's smallest threshold; a
p-value well above its floor draws none. The cost is a few tests' worth per test near the floor, whatever the family's
size (at most `MAX_RESAMPLES` each); a p-value still at a floor over the smallest threshold there is stated as
unresolved, and the family has no verdict on it.

Resolving states a p-value faithfully, but the bootstrap-t is not calibrated that far out: a sample's skew understates
its law's (the few personas that carry a change are rarely all drawn), and the far tail of the studentized statistic
runs heavier than the resamples say, the further out the heavier (bench/gate_family_level.py measured one side's false
alarms at the Holm threshold (1 - confidence)/m at 2-9x nominal under skewed persona-level changes, at 80 and at 252
personas; a skewness-corrected bootstrap-t, Hall's transformation, moved them by less than their noise). So a gate's
family pays more for its size: Holm's step-down with thresholds (1 - confidence)/k^`FAMILY_PENALTY` instead of /k
(one test pays nothing: the gate's own level is unchanged). And a change carried by a few personas may be missing
from the sample altogether, which no resampling can make up for: a family's level holds for changes carried by one
persona in 20 (`RARE_SHARE`) only with the personas that hold one of them but for a chance under the family's smallest
one-sided threshold (`gate_personas`: 80 for one test, as `GATE_PERSONAS`; 165 for 80 tests; a full run's 252 serve a
family of thousands); with fewer, for commoner carriers only. `family_level` states the level measured so and what it
holds for at the personas a family has; a verdict and a night print it where they are read.

Draws from a fixed seed over the personas in sorted order: the same units give the same interval whatever order a
run wrote them in. Under `MIN_PERSONAS` personas there is no interval and no p-value: their fields are None, in
every file and table, never a number.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from pydantic import BaseModel, PrivateAttr

from cupid.matcher.scores import MatchCounts

N_RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 0
POWER = 0.80  # `detectable` is the difference a comparison finds this often
MIN_PERSONAS = 10  # fewer, and an interval says more about the resampling than about the model
GATE_PERSONAS = 80  # fewer, and the gate gives no verdict: skewed changes push its false alarms over the level
# The gate's two-sided level is 3.5% (1.75% a side): the studentized bootstrap runs about a point over its nominal
# level under skewed changes at `GATE_PERSONAS` (tests/eval/test_gate_level.py), and the gate promises 2.5% a side
# within 3.5%.
GATE_CONFIDENCE = 0.965
FAMILY_PENALTY = 1.5  # a gate's family of m tests: Holm's thresholds (1 - confidence)/k**1.5, k = m, m - 1, ..., 1
RARE_SHARE = 0.05  # the rarest share of personas carrying a change that a family's personas must hold (`gate_personas`)
RESOLVE_TAIL = 20  # resamples beyond the observed t that state a p-value to within ~a quarter of itself
MAX_RESAMPLES = 1_000_000  # a test's most: resolves a gate's family of ~420 tests (100 candidates' night)
_ROUND = 8_000  # resamples drawn at once while resolving (~16 MB of draws at 252 personas)

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
    the same t (p < 1 - confidence exactly when the interval excludes 0), the bootstrap standard error `se`, and
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
    studentized: bool = False  # interval and p from the bootstrap-t (the gate's test), else the t law
    resamples: int | None = None  # the resamples a bootstrap-t p-value rests on (None: exact, or the t law's)
    _tail: _Tail | None = PrivateAttr(default=None)  # what resolving the p-value further needs

    @property
    def resolved(self) -> bool:
        return self.personas >= MIN_PERSONAS and self.p_value is not None

    @property
    def floor(self) -> float | None:
        """The smallest p-value its resamples can state, 2/(resamples + 1); None for a p-value with none (exact, or
        the t law's)."""
        return _floor(self.resamples) if self.resamples else None

    def resolve(self, threshold: float) -> bool:
        """Resample a bootstrap-t p-value further where it sits near its floor, until `RESOLVE_TAIL` resamples lie
        beyond the observed t or the floor is under half of `threshold` (the smallest threshold of the family it
        enters; under `threshold` itself while no resample lies beyond, the p-value being its floor then: half a
        collapse's resamples), at most `MAX_RESAMPLES`. False where its floor is still at or over `threshold` near
        it: it cannot say whether it is under. Idempotent; a difference read back from a file is taken as it is."""
        tail = self._tail
        if tail is None:
            return True
        while (
            tail.beyond() < RESOLVE_TAIL
            and tail.resamples < MAX_RESAMPLES
            and tail.floor() >= threshold / (2 if tail.beyond() else 1)
        ):
            tail.draw(min(tail.resamples, _ROUND, MAX_RESAMPLES - tail.resamples))
        self.p_value, self.resamples = tail.p_value(), tail.resamples
        return tail.beyond() >= RESOLVE_TAIL or tail.floor() < threshold

    def carry_tail(self, other: Difference) -> None:
        """Take `other`'s means to resolve (a row built from a difference's fields)."""
        self._tail = other._tail

    @property
    def gated(self) -> bool:
        """Enough personas for the gate to give a verdict on it (`GATE_PERSONAS`)."""
        return self.resolved and self.personas >= GATE_PERSONAS


def detectable(
    se: float | None, personas: int, tests: int = 1, confidence: float = CONFIDENCE, penalty: float = 1.0
) -> float | None:
    """(t_{1 - alpha / (2 tests^penalty)} + t_{POWER}) x se, t with personas - 1 degrees of freedom (the test's own):
    what a two-sided test among `tests` (Holm's first step; `penalty`: `FAMILY_PENALTY` in a gate's family) finds
    `POWER` of the time; None for no spread (nothing is learnt of the power from identical runs) and under
    `MIN_PERSONAS`."""
    if se is None or se <= 0 or personas < MIN_PERSONAS:
        return None
    df = personas - 1
    return (_t_quantile(1 - (1 - confidence) / (2 * tests**penalty), df) + _t_quantile(POWER, df)) * se


def family_level(tests: int, personas: int, confidence: float = GATE_CONFIDENCE) -> str:
    """The sentence a gate's verdict is read by: its family's step-down, the level held (its own, 1 - confidence, as
    bench/gate_family_level.py measured it on null pairs), and the persona-level changes it holds for at these
    personas (1 in `RARE_SHARE`'s 20 or more at `gate_personas`; rarer carriers below them can be missing from the
    sample, and then a false alarm is likelier than the level)."""
    alpha, tests = 1 - confidence, max(tests, 1)
    needed = gate_personas(tests, confidence)
    if personas >= needed:
        reach = f"changes carried by 1 persona in {round(1 / RARE_SHARE)} or more"
    else:
        one_in = int(1 / (1 - (alpha / (2 * tests)) ** (1 / max(personas, 1))))
        reach = (
            f"changes carried by 1 persona in {one_in} or more; rarer carriers can raise false alarms "
            f"(1 in {round(1 / RARE_SHARE)} needs {needed} personas)"
        )
    return (
        f"{tests} headline test(s), {personas} personas, Holm stepping at {alpha:.3f}/k^{FAMILY_PENALTY:g}: one "
        f"side's family-wise false alarms held within {alpha:.1%} under skewed persona-level {reach}."
    )


def gate_personas(tests: int, confidence: float = GATE_CONFIDENCE) -> int:
    """The fewest personas a gate's family of `tests` gives verdicts on: enough that a change carried by `RARE_SHARE`
    of the personas is missing from the sample less often than the family's smallest one-sided threshold,
    (1 - `RARE_SHARE`)^n <= (1 - confidence) / (2 tests); never fewer than `GATE_PERSONAS`."""
    needed = np.log((1 - confidence) / (2 * max(tests, 1))) / np.log(1 - RARE_SHARE)
    return max(GATE_PERSONAS, int(np.ceil(needed)))


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


def _floor(resamples: int) -> float:
    """The smallest two-sided p-value `resamples` bootstrap-t resamples can state: none beyond the observed t."""
    return 2 / (resamples + 1)


def _draws(rng: np.random.Generator, n: int, count: int) -> np.ndarray:
    """(count, n): how many times each of n personas is drawn in each of `count` resamples, as n draws with
    replacement counted per resample (the multinomial's law; half the time of `Generator.multinomial`, which is most
    of a far p-value's resolving)."""
    drawn = rng.integers(0, n, size=(count, n), dtype=np.int32) + (np.arange(count, dtype=np.int32) * n)[:, None]
    return np.bincount(drawn.ravel(), minlength=count * n).reshape(count, n).astype(float)


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
    min_personas: int = MIN_PERSONAS,
) -> dict[str, Interval]:
    """Each figure of `statistic` on the units (`values`: one row of columns per scored unit, `personas` its
    persona) with its interval (none under `min_personas`); {} for no units."""
    if len(personas) == 0:
        return {}
    n_personas, (sums,) = by_persona(personas, np.asarray(values, dtype=float))
    samples = statistic(_weights(n_personas, n_resamples, seed) @ sums)
    estimates = statistic(sums.sum(axis=0))
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
    studentized: bool = False,
    null: float = 0.0,
) -> dict[str, Difference]:
    """Each figure's B - A on matched units (row i of `a` and of `b` is one unit, of persona `personas[i]`),
    resampling personas with both runs' units together; {} for no units. `tests`: the size of the family the
    difference is tested in (for `detectable`). `studentized`: the interval and p-value of the bootstrap-t (the
    gate's test); `null`: the difference the p-value tests (0: no change; a gate's -margin)."""
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
        low = high = p = tail = None
        if resolved and studentized:
            low, high, p, tail = _bootstrap_t(
                _one(statistic, name), weights, sums_a, sums_b, difference, null, confidence, seed
            )
        elif resolved:
            low, high, p = _t_test(difference - null, se, n_personas - 1, confidence)
            low, high = low + null, high + null
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
            null=null,
            studentized=studentized and resolved,
            resamples=tail.resamples if tail else None,
        )
        out[name]._tail = tail
    return out


def _one(statistic: Statistic, name: str) -> Callable[[np.ndarray], np.ndarray]:
    return lambda sums: statistic(sums)[name]


def only(statistic: Statistic, name: str) -> Statistic:
    """`statistic` reduced to its figure `name` (a test of one figure reports no other)."""
    return lambda sums: {name: statistic(sums)[name]}


def _gradient(f: Callable[[np.ndarray], np.ndarray], sums: np.ndarray, columns: Sequence[int]) -> np.ndarray:
    """d f / d sums at each row of `sums` (..., k), by central differences (the figures are smooth ratios of sums),
    in `columns` alone (the others are columns the figure does not read: 0). A column at a time: one call over all
    columns' steps at once builds arrays 2k times larger, and was slower."""
    out = np.zeros_like(sums)
    for c in columns:
        h = 1e-6 * np.maximum(np.abs(sums[..., c]), 1.0)
        up, down = sums.copy(), sums.copy()
        up[..., c] += h
        down[..., c] -= h
        out[..., c] = (f(up) - f(down)) / (2 * h)
    return out


def _read_columns(f: Callable[[np.ndarray], np.ndarray], *sums: np.ndarray) -> list[int]:
    """The columns `f` reads: those whose change moves it at either run's totals (micro F1 reads the four counts of
    `PRF_COLUMNS`, none of the per-unit scores: half the gradient's work)."""
    totals = np.stack([s.sum(axis=0) for s in sums])
    base = f(totals)
    moved = []
    for c in range(totals.shape[-1]):
        step = totals.copy()
        step[:, c] += 1e-3 * np.maximum(np.abs(totals[:, c]), 1.0)
        if np.any(f(step) != base):
            moved.append(c)
    return moved


def _linearized_se(
    f: Callable[[np.ndarray], np.ndarray],
    weights: np.ndarray,
    sums_a: np.ndarray,
    sums_b: np.ndarray,
    columns: Sequence[int],
) -> np.ndarray:
    """The standard error of f(B) - f(A) on each resample (`weights`: (..., n) draws of the personas whose sums are
    `sums_a`, `sums_b`), from each drawn persona's influence: the gradient at the resample's totals times its sums
    (`columns`: those `f` reads)."""
    n = sums_a.shape[0]
    # B's gradient and minus A's side by side, times both runs' sums: one product, and the influence is the only
    # array of the draws' shape made (each such temporary is fresh memory, faulted in page by page, which costs
    # more than the arithmetic on it).
    gradients = np.concatenate([_gradient(f, weights @ sums_b, columns), -_gradient(f, weights @ sums_a, columns)], -1)
    influence = gradients @ np.concatenate([sums_b, sums_a], axis=-1).T
    # sum w (I - m)^2 = sum w I^2 - n m^2, with m = sum w I / n and sum w = n
    mean = np.einsum("...n,...n->...", weights, influence) / n
    spread = np.einsum("...n,...n,...n->...", weights, influence, influence) - n * mean * mean
    return np.sqrt(np.maximum(spread, 0.0) * n / (n - 1))


@dataclass
class _Tail:
    """A bootstrap-t test's resamples so far, and what drawing more needs: the figure, both runs' per-persona sums,
    the columns it reads, the estimate, its standard error and the observed t."""

    f: Callable[[np.ndarray], np.ndarray]
    sums_a: np.ndarray
    sums_b: np.ndarray
    columns: list[int]
    difference: float
    observed: float  # (difference - null) / se
    seed: int
    at_or_above: int = 0  # resamples whose t is >= the observed
    at_or_below: int = 0
    resamples: int = 0

    def t_star(self, weights: np.ndarray) -> np.ndarray:
        """Each resample's t, (its difference - the estimate) / its own standard error."""
        centred = self.f(weights @ self.sums_b) - self.f(weights @ self.sums_a) - self.difference
        per_resample = _linearized_se(self.f, weights, self.sums_a, self.sums_b, self.columns)
        safe = np.where(per_resample > 1e-12, per_resample, 1.0)
        return np.where(per_resample > 1e-12, centred / safe, 0.0)

    def count(self, t_star: np.ndarray) -> None:
        self.at_or_above += int((t_star >= self.observed).sum())
        self.at_or_below += int((t_star <= self.observed).sum())
        self.resamples += len(t_star)

    def draw(self, count: int) -> None:
        """`count` more resamples, from a stream of their own (the seed and how many came before)."""
        n = self.sums_a.shape[0]
        rng = np.random.default_rng([self.seed, self.resamples])
        self.count(self.t_star(_draws(rng, n, count)))

    def beyond(self) -> int:
        return min(self.at_or_above, self.at_or_below)

    def floor(self) -> float:
        return _floor(self.resamples)

    def p_value(self) -> float:
        """Two-sided: the observed t's place among the resamples, (count + 1) / (resamples + 1) each side."""
        return min(1.0, 2 * (self.beyond() + 1) / (self.resamples + 1))


def _bootstrap_t(
    f: Callable[[np.ndarray], np.ndarray],
    weights: np.ndarray,
    sums_a: np.ndarray,
    sums_b: np.ndarray,
    difference: float,
    null: float,
    confidence: float,
    seed: int,
) -> tuple[float, float, float, _Tail | None]:
    """The bootstrap-t interval, the two-sided p-value for `null` and the test's resamples (to resolve it further);
    with no spread, the difference is certain (and the p-value exact)."""
    columns = _read_columns(f, sums_a, sums_b)
    se = float(_linearized_se(f, np.ones(sums_a.shape[0]), sums_a, sums_b, columns))
    if se <= 1e-12:
        return difference, difference, 1.0 if difference == null else 0.0, None
    tail = _Tail(f, sums_a, sums_b, columns, difference, (difference - null) / se, seed)
    t_star = tail.t_star(weights)
    tail.count(t_star)
    low_q, high_q = np.quantile(t_star, [(1 - confidence) / 2, 1 - (1 - confidence) / 2])
    return difference - float(high_q) * se, difference - float(low_q) * se, tail.p_value(), tail


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


def holm(p_values: Sequence[float], penalty: float = 1.0) -> list[float]:
    """Holm-adjusted p-values (family-wise error over the given tests), in the given order; `penalty`: the step-down's
    thresholds are alpha/k^penalty (`FAMILY_PENALTY` for a gate's family; 1: Holm's). Written out rather than taken
    from statsmodels' `multipletests`, whose Holm branch runs a full `gc.collect()` on every call, slow in a process
    holding many objects, once per comparison (a nightly makes dozens); tests/eval/test_stats.py checks the two
    agree."""
    if not p_values:
        return []
    p = np.asarray(p_values, dtype=float)
    order = np.argsort(p, kind="stable")
    stepped = np.minimum(1.0, np.maximum.accumulate(p[order] * np.arange(len(p), 0, -1) ** penalty))
    adjusted = np.empty_like(stepped)
    adjusted[order] = stepped
    return [float(x) for x in adjusted]


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


def micro_f1(sums: np.ndarray) -> np.ndarray:
    """Micro F1 from sums of `PRF_COLUMNS`: F1 of the ratios of summed counts (the published aggregate)."""
    s = np.asarray(sums, dtype=float)
    return _f1(ratio(s[..., 0], s[..., 1]), ratio(s[..., 2], s[..., 3]))


def prf(sums: np.ndarray) -> dict[str, np.ndarray]:
    """Micro (ratios of summed counts) and macro (summed per-unit scores over units) P/R/F1, from sums of
    `PRF_COLUMNS`."""
    s = np.asarray(sums, dtype=float)
    p, r = ratio(s[..., 0], s[..., 1]), ratio(s[..., 2], s[..., 3])
    units = s[..., 7]
    return {
        "micro_precision": p,
        "micro_recall": r,
        "micro_f1": micro_f1(s),
        "macro_precision": ratio(s[..., 4], units),
        "macro_recall": ratio(s[..., 5], units),
        "macro_f1": ratio(s[..., 6], units),
    }


def mean_score(sums: np.ndarray) -> dict[str, np.ndarray]:
    """The mean judge score, from sums of (score, 1)."""
    s = np.asarray(sums, dtype=float)
    return {"mean_score": ratio(s[..., 0], s[..., 1])}
