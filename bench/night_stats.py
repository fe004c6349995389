"""The statistics of a night at 20 and 100 candidates on 252 personas: every candidate's comparisons (inference and
generation in the standard setting, against the previous night and the baseline, every row `cupid compare` makes) and
the night's one Holm family over the headlines' e-values, with each one's `detectable`. A tenth of the candidates
collapse; the others do not change. The model calls are not here (the cache or the GPU pays those): this is what the
night adds on the CPU.

    python -m bench.night_stats [--candidates 20 100]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from cupid.eval.benchmark.data import INSTANCE_TYPES
from cupid.eval.benchmark.generation import GENERATION
from cupid.eval.benchmark.inference import INFERENCE, prf_columns
from cupid.eval.results.compare import holm_family, task_rows

PERSONAS = 252


def inference_units(rng: np.random.Generator, drop: float) -> tuple[np.ndarray, np.ndarray]:
    """`PRF_COLUMNS` of two runs' units: a persona's ability and its change, checklists of 3-6 items."""
    n = PERSONAS * 3
    persona = np.repeat(np.arange(PERSONAS), 3)
    logit = rng.normal(0, 1.0, PERSONAS)[persona] + rng.normal(0, 0.3, n)
    runs = []
    for shift in (np.zeros(n), rng.normal(0, 1.2, PERSONAS)[persona]):
        q = 1 / (1 + np.exp(-(logit + shift)))
        n_pred, n_true = rng.integers(3, 7, n), rng.integers(3, 7, n)
        counts = np.stack([rng.binomial(2 * n_pred, q) / 2, n_pred, rng.binomial(2 * n_true, q) / 2, n_true], 1)
        runs.append(prf_columns(counts))
    runs[1][:, [0, 2]] *= 1 - drop
    return runs[0], runs[1]


def generation_units(rng: np.random.Generator, lower: float) -> tuple[np.ndarray, np.ndarray]:
    n = PERSONAS * 3
    level = 6 + rng.normal(0, 1.5, PERSONAS)[np.repeat(np.arange(PERSONAS), 3)]
    a = np.clip(np.round(level + rng.normal(0, 1.5, n)), 1, 10)
    b = np.clip(np.round(level + rng.normal(0, 1.5, n)), 1, 10) - lower
    return np.column_stack([a, np.ones(n)]), np.column_stack([b, np.ones(n)])


def night(candidates: int, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    names = [f"p{i:03d}" for i in np.repeat(np.arange(PERSONAS), 3)]
    types = list(INSTANCE_TYPES) * PERSONAS
    start = time.perf_counter()
    headlines = []
    for c in range(candidates):
        collapsed = c % 10 == 0
        for _side in ("previous", "baseline"):
            rows = task_rows(INFERENCE, "standard", names, types, *inference_units(rng, 0.4 * collapsed), True)
            rows += task_rows(GENERATION, "standard", names, types, *generation_units(rng, 2.0 * collapsed), True)
            headlines += [row for row in rows if row.headline]
    compared = time.perf_counter()
    holm_family(headlines)
    done = time.perf_counter()
    return {
        "candidates": candidates,
        "headline tests": len(headlines),
        "comparisons s": round(compared - start, 1),
        "Holm family s": round(done - compared, 1),
        "total s": round(done - start, 1),
        "flagged": sum(row.regression for row in headlines),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, nargs="+", default=[20, 100])
    for n in parser.parse_args().candidates:
        print(night(n), flush=True)


if __name__ == "__main__":
    main()
