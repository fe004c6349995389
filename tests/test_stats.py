"""Bootstrap intervals over instances: cases whose bootstrap distribution is known by hand, and the
properties an interval must have (contains the estimate, narrows with more data, fixed by the seed)."""

import numpy as np
import pytest
from scipy.stats import bootstrap

from cupid.eval.stats import mean_interval, prf_intervals
from cupid.matcher.scores import MatchCounts, macro, micro

PERFECT = MatchCounts(2.0, 2, 3.0, 3)  # P = R = F1 = 1
MISSED = MatchCounts(0.0, 2, 0.0, 3)  # P = R = F1 = 0
# A spread of instances like a real run's: 2-4 items per checklist, labels 0 / 0.5 / 1.
VARIED = [
    MatchCounts(1.5, 3, 1.0, 2), MatchCounts(0.0, 2, 0.5, 3), MatchCounts(2.0, 2, 2.5, 3), MatchCounts(0.5, 4, 0.0, 2),
    MatchCounts(1.0, 3, 1.5, 3), MatchCounts(3.0, 4, 2.0, 4), MatchCounts(0.0, 3, 0.0, 2), MatchCounts(1.0, 2, 1.0, 3),
    MatchCounts(2.5, 3, 1.5, 2), MatchCounts(0.5, 2, 1.0, 4), MatchCounts(1.5, 4, 2.5, 3), MatchCounts(2.0, 3, 0.5, 2),
]  # fmt: skip


def test_two_instances_give_the_hand_computed_interval():
    # Resampling {0, 1} twice: the mean is 0, 0.5 or 1 with probability 1/4, 1/2, 1/4.
    # 95% percentile interval: [0, 1]. 40% interval (30th..70th percentile): both ends inside the 1/2 mass.
    assert mean_interval([0.0, 1.0]).as_dict() == {"estimate": 0.5, "low": 0.0, "high": 1.0, "n": 2}
    narrow = mean_interval([0.0, 1.0], confidence=0.4)
    assert (narrow.low, narrow.high) == (0.5, 0.5)
    # Micro F1 of one perfect and one missed instance follows the same law: the share of PERFECT drawn.
    intervals = prf_intervals([PERFECT, MISSED])
    assert intervals["micro"]["f1"].estimate == pytest.approx(0.5)
    assert (intervals["micro"]["f1"].low, intervals["micro"]["f1"].high) == (0.0, 1.0)
    narrow = prf_intervals([PERFECT, MISSED], confidence=0.4)["micro"]["f1"]
    assert (narrow.low, narrow.high) == pytest.approx((0.5, 0.5))


def test_estimates_are_the_summary_aggregates_and_inside_their_intervals():
    intervals = prf_intervals(VARIED)
    for aggregate, expected in (("micro", micro(VARIED)), ("macro", macro(VARIED))):
        for name in ("precision", "recall", "f1"):
            interval = intervals[aggregate][name]
            assert interval.estimate == getattr(expected, name)
            assert interval.low < interval.estimate < interval.high
            assert 0.0 <= interval.low and interval.high <= 1.0
            assert interval.n == len(VARIED)


def test_interval_narrows_with_more_instances_of_the_same_kind():
    small = prf_intervals(VARIED)
    large = prf_intervals(VARIED * 16)
    for aggregate in ("micro", "macro"):
        assert large[aggregate]["f1"].estimate == pytest.approx(small[aggregate]["f1"].estimate)
        # 16x the instances: about a quarter of the width (1/sqrt(16)); well under half in any case.
        assert large[aggregate]["f1"].half_width < 0.5 * small[aggregate]["f1"].half_width
    scores = [1, 3, 4, 4, 5, 6, 7, 7, 8, 10]
    assert mean_interval(scores * 16).half_width < 0.5 * mean_interval(scores).half_width


def test_same_instances_same_interval_in_any_order_other_seed_other_draws():
    assert prf_intervals(VARIED) == prf_intervals(VARIED) == prf_intervals(VARIED[::-1])
    assert mean_interval([1, 5, 9, 2]) == mean_interval([2, 9, 5, 1])
    other = prf_intervals(VARIED, seed=1)["micro"]["f1"]
    assert (other.low, other.high) != (prf_intervals(VARIED)["micro"]["f1"].low, prf_intervals(VARIED)["micro"]["f1"].high)
    assert other.estimate == prf_intervals(VARIED)["micro"]["f1"].estimate


def test_agrees_with_scipy_percentile_bootstrap_on_the_mean():
    values = np.random.default_rng(7).integers(1, 11, size=60).astype(float)  # judge scores 1..10
    ours = mean_interval(values, n_resamples=5000)
    theirs = bootstrap((values,), np.mean, n_resamples=5000, method="percentile", confidence_level=0.95, rng=np.random.default_rng(3))
    # Two independent Monte Carlo draws of the same percentile interval: ends agree to a small fraction of the width.
    width = theirs.confidence_interval.high - theirs.confidence_interval.low
    assert ours.low == pytest.approx(theirs.confidence_interval.low, abs=0.1 * width)
    assert ours.high == pytest.approx(theirs.confidence_interval.high, abs=0.1 * width)


def test_degenerate_inputs():
    one = prf_intervals([MatchCounts(1.0, 2, 1.5, 2)])["micro"]
    assert (one["precision"].low, one["precision"].estimate, one["precision"].high) == (0.5, 0.5, 0.5)
    assert one["f1"].low == pytest.approx(one["f1"].high) == pytest.approx(one["f1"].estimate)
    # An empty inferred checklist scores precision 0 (as matcher.scores does), never a division error.
    empty = prf_intervals([MatchCounts(0.0, 0, 0.0, 3), PERFECT])
    assert empty["micro"]["precision"].estimate == micro([MatchCounts(0.0, 0, 0.0, 3), PERFECT]).precision
    assert prf_intervals([]) is None and mean_interval([]) is None
