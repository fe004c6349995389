"""The gate's level and power on laws of persona-level changes like CUPID's, sparse ones included.

Level: for each law of persona changes (in [-1, 1], mean exactly 0: no change), `--tests` null tests at each persona
count; a family of m independent tests gives a false REGRESSION when any test's e-value reaches m / 0.025 (Holm's first
step), so the family's rate is 1 - (1 - q)^m, q the share of tests over that threshold. Beside it, a t test at the
same thresholds on the same draws (the symmetric test the gate did not take): the sparse laws are where it fails.

Power: at 80, 138 and 252 personas and families of 1, 20 and 80 tests, the `detectable` drop the gate states (from a
draw of the law, as a comparison states it from its runs), and the share of fresh draws of the law moved down by the
drop stated on another draw that the gate flags, with Wilson's 95% interval; then the power at drops of 0.03 and 0.05.
`detectable` takes the observed changes as the law of the noise: where a sparse law's few large changes are missing
from the draw, it is optimistic, and this says by how much.

    python -m bench.gate_level [--tests 20000] [--power-draws 2000] [--laws NAME ...]

One-off (a minute or two on one core); its figures go on docs/performance.md, never in a test.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
from scipy.special import stdtr
from statsmodels.stats.proportion import proportion_confint

from cupid.eval.benchmark import evalues
from cupid.eval.benchmark.stats import GATE_ALPHA, POWER

PERSONAS = (80, 138, 252)
FAMILIES = (1, 2, 8, 20, 80)
POWER_FAMILIES = (1, 20, 80)
Law = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]


def _two_point(gain: float, share: float, loss: float) -> Law:
    """`share` of the personas gain `gain`, as many as make the mean 0 lose `loss`, the rest do not change."""
    losers = share * gain / loss
    return lambda rng, size: np.select([(u := rng.uniform(size=size)) < share, u < share + losers], [gain, -loss], 0.0)


def _symmetric_clip(law: Law) -> Law:
    """A symmetric law clipped to [-1, 1] at both ends stays symmetric: its mean stays 0."""
    return lambda rng, size: np.clip(law(rng, size), -1.0, 1.0)


def _quarter(rng: np.random.Generator, size: tuple[int, ...]) -> np.ndarray:
    return np.where(rng.uniform(size=size) < 0.25, np.clip(rng.normal(0, 0.3, size), -1, 1), 0.0)


LAWS: dict[str, Law] = {
    "normal, sd 0.15": _symmetric_clip(lambda rng, size: rng.normal(0, 0.15, size)),
    "t(2), scale 0.1": _symmetric_clip(lambda rng, size: 0.1 * rng.standard_t(2, size)),
    "a quarter change, sd 0.3": _quarter,
    "sparse: 2% gain 0.5, 8% lose 0.125": _two_point(0.5, 0.02, 0.125),
    "sparse: 1% gain 0.9, 9% lose 0.1": _two_point(0.9, 0.01, 0.1),
    "sparse: 2% lose 0.5, 8% gain 0.125": lambda rng, size: -_two_point(0.5, 0.02, 0.125)(rng, size),
    "discrete: one unit of three, +-1/3 at 10% each": lambda rng, size: rng.choice(
        [-1 / 3, 0.0, 1 / 3], size=size, p=[0.1, 0.8, 0.1]
    ),
    "discrete: 3% gain 2/3, 6% lose 1/3": _two_point(2 / 3, 0.03, 1 / 3),
    "skewed: Beta(0.5, 4.5) - 0.1": lambda rng, size: rng.beta(0.5, 4.5, size) - 0.1,
    "skewed, mirrored": lambda rng, size: 0.1 - rng.beta(0.5, 4.5, size),
}


def _t_p(changes: np.ndarray) -> np.ndarray:
    """The one-sided (drop) p-value of a t test of mean 0, per row."""
    n = changes.shape[-1]
    se = changes.std(axis=-1, ddof=1) / np.sqrt(n)
    t = np.divide(changes.mean(axis=-1), se, out=np.zeros(changes.shape[:-1]), where=se > 0)
    return stdtr(n - 1, t)


def level(name: str, tests: int, seed: int = 74) -> list[dict[str, object]]:
    """Each persona count's family-wise false-alarm rates (one side: a drop) under `name`, the gate's and the t
    test's, for each family size."""
    out = []
    for n in PERSONAS:
        rng = np.random.default_rng(seed)
        changes = np.concatenate([LAWS[name](rng, (min(2000, tests), n)) for _ in range(-(-tests // 2000))])[:tests]
        log_e, t_p = evalues.log_e_values(changes), _t_p(changes)
        row: dict[str, object] = {"law": name, "personas": n}
        for m in FAMILIES:
            q_gate = float((log_e >= np.log(m / GATE_ALPHA)).mean())
            q_t = float((t_p <= GATE_ALPHA / m).mean())
            row[f"m={m}"] = (round(100 * (1 - (1 - q_gate) ** m), 2), round(100 * (1 - (1 - q_t) ** m), 2))
        out.append(row)
    return out


def _wilson(hits: int, n: int) -> str:
    low, high = proportion_confint(hits, n, alpha=0.05, method="wilson")
    return f"{100 * hits / n:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"


def power(name: str, draws: int, seed: int = 75) -> list[dict[str, object]]:
    """At each persona count and family size: the `detectable` drop the gate states (its median over draws), and
    the share of draws flagged where each draw's runs fell by the drop the gate stated on another draw of the same
    law (what a user who reads `detectable` off one comparison then meets); then the power at drops of 0.03 and 0.05."""
    out = []
    for n in PERSONAS:
        for m in POWER_FAMILIES:
            rng = np.random.default_rng(seed)
            threshold = np.log(m / GATE_ALPHA)
            stated = [evalues.detectable(LAWS[name](rng, (n,)), 0.0, GATE_ALPHA / m, POWER) for _ in range(draws)]
            drops = np.array([1.0 if d is None else d for d in stated])
            row: dict[str, object] = {"law": name, "personas": n, "tests": m, "detectable": float(np.median(drops))}
            for label, drop in (("at detectable", drops[:, None]), ("at 0.03", 0.03), ("at 0.05", 0.05)):
                moved = np.clip(LAWS[name](rng, (draws, n)) - drop, -1, 1)
                row[label] = _wilson(int((evalues.log_e_values(moved) >= threshold).sum()), draws)
            out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=20_000, help="null tests a law and persona count")
    parser.add_argument("--power-draws", type=int, default=2000, help="draws a power figure rests on")
    parser.add_argument("--laws", nargs="+", default=list(LAWS), choices=list(LAWS))
    parser.add_argument("--power-laws", nargs="+", default=["normal, sd 0.15", "a quarter change, sd 0.3"])
    args = parser.parse_args()
    print("level: one side's family-wise false alarms in %, (the gate's betting e-value, a t test), Holm at 0.025/m")
    for name in args.laws:
        for row in level(name, args.tests):
            print(row, flush=True)
    print("power: the gate's stated detectable drop, and the share of draws it flags (Wilson 95%)")
    for name in args.power_laws:
        for row in power(name, args.power_draws):
            print(row, flush=True)


if __name__ == "__main__":
    main()
