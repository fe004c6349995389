"""The gate's false alarms at a night's family sizes: null pairs at `GATE_PERSONAS` under each law of
tests/eval/test_gate_level.py (and the 5/95 mixtures), each p-value resolved for a family of 80 tests, counted under
the smallest Holm threshold of families of 2, 8, 20 and 80 on each side, beside the count a calibrated p-value gives.
m times a side's share under 0.035/m bounds the family-wise one-sided false alarms of m null tests. One-off (minutes a
law on one core); its figures go in notes, never in a test.

    python -m bench.gate_family_level [--pairs 2000] [--laws NAME ...]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np

from cupid.eval.benchmark import stats
from cupid.eval.benchmark.stats import paired
from tests.eval.test_gate_level import SKEWED, mixture, null_shift, shifted
from tests.eval.test_stats import headline, simulate

FAMILIES = (2, 8, 20, 80)


LAWS: dict[str, Callable[[np.random.Generator, int], np.ndarray]] = {
    "normal (1.2)": lambda rng, n: rng.normal(0, 1.2, n),
    **SKEWED,
    "5/95, gain 3.8": mixture(0.05, 3.8),
    "5/95, lose 3.8": lambda rng, n: -mixture(0.05, 3.8)(rng, n),
    "5/95, gain 5.7": mixture(0.05, 5.7),
    "5/95, lose 5.7": lambda rng, n: -mixture(0.05, 5.7)(rng, n),
}


def law_level(name: str, pairs: int) -> dict[str, object]:
    law = LAWS[name]
    change, rng = shifted(law, null_shift(law)), np.random.default_rng(53)
    alpha = 1 - stats.GATE_CONFIDENCE
    gate = [0, 0]
    tails = {m: [0, 0] for m in FAMILIES}
    for _ in range(pairs):
        names, a, b = simulate(rng, stats.GATE_PERSONAS, change_law=change)
        d = paired(names, a, b, headline, studentized=True, confidence=stats.GATE_CONFIDENCE)["micro_f1"]
        side = 0 if d.difference < 0 else 1
        gate[0] += bool(d.high is not None and d.high < 0)
        gate[1] += bool(d.low is not None and d.low > 0)
        d.resolve(alpha / max(FAMILIES))
        for m in FAMILIES:
            tails[m][side] += bool(d.p_value is not None and d.p_value < alpha / m)
    return {
        "law": name,
        "pairs": pairs,
        "gate's one-sided false flags (below, above) %": [round(100 * k / pairs, 2) for k in gate],
        "under 0.035/m (below, above), m: count": tails,
        "a calibrated p-value's count per side": {m: round(pairs * alpha / (2 * m), 2) for m in FAMILIES},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--laws", nargs="+", default=list(LAWS), choices=list(LAWS))
    args = parser.parse_args()
    for name in args.laws:
        print(law_level(name, args.pairs), flush=True)


if __name__ == "__main__":
    main()
