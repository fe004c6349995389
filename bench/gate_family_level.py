"""The gate's false alarms at a night's family sizes: null pairs under each law of tests/eval/test_gate_level.py (and
the 5/95 mixtures) at `--personas` (default: the personas a family of 80 states its level at), each p-value resolved
for a family of 80 tests, counted on each side under Holm's smallest threshold (1 - confidence)/m and under the gate's
step-down's, (1 - confidence)/m^`FAMILY_PENALTY`, for families of 2, 8, 20 and 80, beside what the level allows a side:
m times a side's share bounds the family's one-sided false alarms, held within 1 - confidence. One-off (minutes a law
on one core); its figures go on docs/performance.md, never in a test.

    python -m bench.gate_family_level [--pairs 4000] [--personas 165] [--laws NAME ...]
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


def law_level(name: str, pairs: int, personas: int, seed: int = 54) -> dict[str, object]:
    law = LAWS[name]
    change, rng = shifted(law, null_shift(law)), np.random.default_rng(seed)
    alpha = 1 - stats.GATE_CONFIDENCE
    steps = {"holm": 1.0, "gate": stats.FAMILY_PENALTY}
    counts = {step: {m: [0, 0] for m in FAMILIES} for step in steps}
    for _ in range(pairs):
        names, a, b = simulate(rng, personas, change_law=change)
        d = paired(names, a, b, headline, studentized=True, confidence=stats.GATE_CONFIDENCE)["micro_f1"]
        d.resolve(alpha / max(FAMILIES) ** stats.FAMILY_PENALTY)
        side = 0 if d.difference < 0 else 1
        for step, penalty in steps.items():
            for m in FAMILIES:
                counts[step][m][side] += bool(d.p_value is not None and d.p_value < alpha / m**penalty)
    return {
        "law": name,
        "pairs": pairs,
        "personas": personas,
        "under 0.035/m (below, above)": counts["holm"],
        f"under 0.035/m^{stats.FAMILY_PENALTY:g} (below, above)": counts["gate"],
        "the level allows a side": {m: round(pairs * alpha / m, 2) for m in FAMILIES},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4000)
    parser.add_argument("--personas", type=int, default=stats.gate_personas(max(FAMILIES)))
    parser.add_argument("--laws", nargs="+", default=list(LAWS), choices=list(LAWS))
    args = parser.parse_args()
    for name in args.laws:
        print(law_level(name, args.pairs, args.personas), flush=True)


if __name__ == "__main__":
    main()
