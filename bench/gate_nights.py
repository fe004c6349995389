"""What the nightly bounds across nights, measured: labs of 20 candidates over 30 nights, each candidate run afresh
every night (sampled at temperature > 0, or served without the cache) and tested, both tasks, against the previous
night and against its baseline (its first night): 80 headline tests a night, one Holm family at 0.025 / `horizon`.

A candidate's persona figure on a night is its persona's level plus the night's noise: a quarter of the personas
answer differently each night (normal, sd 0.2), the rest as on the night before the noise. Unchanged, every test is
null; the baseline run's noise is shared by every night's baseline test, so false alarms across nights are not
independent. With `--drop`, one candidate falls by the drop on every persona from night 1 on: the share of labs that
flag it within 1, 3 and 7 nights.

    python -m bench.gate_nights [--labs 100] [--nights 30] [--horizon 1 30] [--drop 0.03 0.05]

One-off (a minute or two on one core); its figures go on docs/performance.md, never in a test.
"""

from __future__ import annotations

import argparse

import numpy as np
from statsmodels.stats.proportion import proportion_confint

from cupid.eval.benchmark import evalues
from cupid.eval.benchmark.stats import GATE_ALPHA

PERSONAS, CANDIDATES, TASKS = 252, 20, 2


def _noise(rng: np.random.Generator, size: tuple[int, ...]) -> np.ndarray:
    return np.where(rng.uniform(size=size) < 0.25, rng.normal(0, 0.2, size), 0.0)


def lab(rng: np.random.Generator, nights: int, horizon: int, drop: float = 0.0) -> list[list[bool]]:
    """One lab's nights: for each night, whether each candidate was flagged (candidate 0 carries `drop`)."""
    level = rng.uniform(0.2, 0.8, size=(CANDIDATES, TASKS, PERSONAS))
    shift = np.zeros((CANDIDATES, 1, 1))
    shift[0] = drop
    baseline = np.clip(level + _noise(rng, level.shape), 0, 1)
    before, flagged = baseline, []
    threshold = np.log(80 * horizon / GATE_ALPHA)  # Holm's first step: any flag in the family needs it
    for _ in range(nights):
        tonight = np.clip(level - shift + _noise(rng, level.shape), 0, 1)
        log_e = np.stack([evalues.log_e_values(tonight - before), evalues.log_e_values(tonight - baseline)])
        flagged.append(list((log_e >= threshold).any(axis=(0, 2))))
        before = tonight
    return flagged


def _share(hits: int, n: int) -> str:
    low, high = proportion_confint(hits, n, alpha=0.05, method="wilson")
    return f"{100 * hits / n:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labs", type=int, default=100)
    parser.add_argument("--nights", type=int, default=30)
    parser.add_argument("--horizon", type=int, nargs="+", default=[1, 30])
    parser.add_argument("--drop", type=float, nargs="+", default=[0.03, 0.05])
    args = parser.parse_args()
    for horizon in args.horizon:
        rng = np.random.default_rng(76)
        labs = [lab(rng, args.nights, horizon) for _ in range(args.labs)]
        nights = [any(night) for one in labs for night in one]
        alarms = sum(sum(night) for one in labs for night in one)
        print(
            {
                "horizon": horizon,
                "labs": args.labs,
                "nights with a false REGRESSION": _share(sum(nights), len(nights)),
                "labs with any in 30 nights": _share(sum(any(map(any, one)) for one in labs), args.labs),
                "false alarms per lab": round(float(alarms) / args.labs, 3),
            },
            flush=True,
        )
        for drop in args.drop:
            rng = np.random.default_rng(77)
            first = [
                next((k for k, night in enumerate(lab(rng, 7, horizon, drop)) if night[0]), None)
                for _ in range(args.labs)
            ]
            found = {f"within {k}": _share(sum(f is not None and f < k for f in first), args.labs) for k in (1, 3, 7)}
            print({"horizon": horizon, "drop": drop, **found}, flush=True)


if __name__ == "__main__":
    main()
