"""The gate's level under skewed persona-level changes: the studentized bootstrap at `GATE_PERSONAS` and the gate's
level, on CUPID-shaped runs simulated as in test_stats.py, null pairs calibrated to exactly no change in micro F1.
Its own file, so that it runs beside test_stats.py's simulations on another worker."""

import numpy as np
import pytest

from cupid.eval.benchmark import stats
from cupid.eval.benchmark.stats import paired
from tests.eval.test_stats import headline, heavy_tailed, micro_f1, simulate

pytestmark = pytest.mark.slow  # ~45 s: the whole suite runs it, `make check` does not


def lognormal(rng, n):
    """Centred lognormal (sigma 1): most personas lose a little, a few gain a lot."""
    return 0.7 * (rng.lognormal(0, 1, n) - np.exp(0.5))


def tenth(rng, n):
    """A tenth of the personas gain a lot, the rest lose a little (each with its own noise)."""
    return np.where(rng.uniform(size=n) < 0.1, 2.7, -0.3) + rng.normal(0, 0.3, n)


def mixture(share, gain):
    """`share` of the personas gain `gain` (logit scale), the rest lose what makes the mean change 0: a change a few
    personas carry, which a sample of 80 misses altogether 1.7% of the time at a share of 5%."""
    loss = -share * gain / (1 - share)
    return lambda rng, n: np.where(rng.uniform(size=n) < share, gain, loss) + rng.normal(0, 0.3, n)


SKEWED = {
    "t(3)": heavy_tailed,
    "lognormal": lognormal,
    "lognormal, mirrored": lambda rng, n: -lognormal(rng, n),
    "a tenth gain a lot": tenth,
    "a tenth lose a lot": lambda rng, n: -tenth(rng, n),
}


def shifted(law, shift):
    return lambda rng, n: law(rng, n) + shift


def null_shift(law):
    """The shift of `law` (logit scale) under which B's micro F1 equals A's on a large population: a null of
    exactly no change in the headline figure, whatever the law's skew."""
    low, high = -1.0, 1.0
    for _ in range(14):  # to 1.2e-4 on the logit scale: ~2e-5 of micro F1, a thousandth of a comparison's spread
        shift = (low + high) / 2
        _, a, b = simulate(np.random.default_rng(123), 50_000, change_law=shifted(law, shift))
        low, high = (low, shift) if micro_f1(b) > micro_f1(a) else (shift, high)
    return (low + high) / 2


def test_the_gate_keeps_its_level_under_skewed_changes_in_both_directions():
    # The gate's own test (the studentized bootstrap at its level, at its minimum of personas): 2,000 null pairs per
    # law, each calibrated to exactly no change in micro F1; one-sided 2.5% promised, <= 3.5% held on either side.
    rates = {}
    for name, law in SKEWED.items():
        change, rng = shifted(law, null_shift(law)), np.random.default_rng(53)
        flags = {"below": 0, "above": 0}
        for _ in range(2000):
            names, a, b = simulate(rng, stats.GATE_PERSONAS, change_law=change)
            d = paired(names, a, b, headline, studentized=True, confidence=stats.GATE_CONFIDENCE)["micro_f1"]
            flags["below"] += d.high < 0
            flags["above"] += d.low > 0
        rates[name] = {side: count / 2000 for side, count in flags.items()}
        print(f"one-sided false flags at {stats.GATE_PERSONAS} personas, {name}: {rates[name]}")
    assert all(rate <= 0.035 for law in rates.values() for rate in law.values()), rates
    assert all(sum(law.values()) >= 0.02 for law in rates.values()), rates  # a test that fires (3.5% two-sided)


def test_a_family_of_twenty_keeps_its_level_at_the_personas_it_states():
    # 20 headline tests at the personas a family of 20 states its level at (138) under the worst law measured (a
    # change 5% of the personas carry), 6,000 null pairs calibrated to no change, each p-value resolved for the
    # family's smallest threshold 0.035/20^1.5: 20 times one side's share under it bounds the family's one-sided false
    # alarms, held within 3.5% (<= 10.5 of 6,000 a side). At Holm's own 0.035/20 the same law flagged 13 of 4,000
    # below (a family's 6.5%).
    tests, pairs = 20, 6000
    personas, threshold = stats.gate_personas(tests), (1 - stats.GATE_CONFIDENCE) / tests**stats.FAMILY_PENALTY
    assert personas == 138
    law = mixture(0.05, 5.7)
    change, rng = shifted(law, null_shift(law)), np.random.default_rng(55)
    flags = {"below": 0, "above": 0}
    for _ in range(pairs):
        names, a, b = simulate(rng, personas, change_law=change)
        d = paired(names, a, b, headline, studentized=True, confidence=stats.GATE_CONFIDENCE)["micro_f1"]
        assert d.resolve(threshold)
        flags["below" if d.difference < 0 else "above"] += d.p_value < threshold
    print(f"under {threshold:.2g} at {personas} personas: {flags}")
    assert all(tests * count / pairs <= 0.035 for count in flags.values()), flags
