"""Intervals and paired comparisons that resample personas: cases whose bootstrap distribution is known by hand,
the properties an interval must have, and a simulation of CUPID-shaped runs (252 personas x 3 instances) that
checks the comparison's error rates: false REGRESSION calls, power, and coverage."""

import numpy as np
import pytest
from scipy.stats import bootstrap

from cupid.eval.benchmark import inference, stats
from cupid.eval.benchmark.generation import mean_score
from cupid.eval.benchmark.inference import PRF_COLUMNS, prf, prf_columns, prf_row
from cupid.eval.benchmark.stats import holm, intervals, paired
from cupid.matcher.scores import MatchCounts, macro, micro

PERFECT = MatchCounts(2.0, 2, 3.0, 3)  # P = R = F1 = 1
MISSED = MatchCounts(0.0, 2, 0.0, 3)  # P = R = F1 = 0
# A spread of instances like a real run's: 2-4 items per checklist, labels 0 / 0.5 / 1.
VARIED = [
    MatchCounts(1.5, 3, 1.0, 2),
    MatchCounts(0.0, 2, 0.5, 3),
    MatchCounts(2.0, 2, 2.5, 3),
    MatchCounts(0.5, 4, 0.0, 2),
    MatchCounts(1.0, 3, 1.5, 3),
    MatchCounts(3.0, 4, 2.0, 4),
    MatchCounts(0.0, 3, 0.0, 2),
    MatchCounts(1.0, 2, 1.0, 3),
    MatchCounts(2.5, 3, 1.5, 2),
    MatchCounts(0.5, 2, 1.0, 4),
    MatchCounts(1.5, 4, 2.5, 3),
    MatchCounts(2.0, 3, 0.5, 2),
]


def prf_intervals(counts, personas=None, **kw):
    """Each unit its own persona unless told otherwise; an interval whatever the number of personas (the hand-worked
    cases have 2)."""
    kw.setdefault("min_personas", 1)
    personas = personas if personas is not None else [f"p{i:03d}" for i in range(len(counts))]
    return intervals(personas, np.array([prf_row(c) for c in counts]), prf, **kw)


def mean_interval(values, personas=None, **kw):
    kw.setdefault("min_personas", 1)
    personas = personas if personas is not None else [f"p{i:03d}" for i in range(len(values))]
    return intervals(personas, np.array([[v, 1.0] for v in values]), mean_score, **kw).get("mean_score")


def test_two_personas_give_the_hand_computed_interval_whatever_their_size():
    # Resampling {0, 1} twice: the mean is 0, 0.5 or 1 with probability 1/4, 1/2, 1/4.
    # 95% percentile interval: [0, 1]. 40% interval (30th..70th percentile): both ends inside the 1/2 mass.
    assert mean_interval([0.0, 1.0]).as_dict() == {"estimate": 0.5, "low": 0.0, "high": 1.0, "n": 2, "personas": 2}
    narrow = mean_interval([0.0, 1.0], confidence=0.4)
    assert (narrow.low, narrow.high) == (0.5, 0.5)
    # Three instances per persona, drawn together: still two draws of {0, 1}, not six.
    clustered = mean_interval([0.0] * 3 + [1.0] * 3, personas=["a"] * 3 + ["b"] * 3)
    assert (clustered.low, clustered.high, clustered.n, clustered.personas) == (0.0, 1.0, 6, 2)
    assert mean_interval([0.0] * 3 + [1.0] * 3).half_width < clustered.half_width  # as if independent: too narrow
    # Micro F1 of one perfect and one missed persona follows the same law: the share of PERFECT drawn.
    f1 = prf_intervals([PERFECT, MISSED])["micro_f1"]
    assert (f1.estimate, f1.low, f1.high) == pytest.approx((0.5, 0.0, 1.0))


def test_estimates_are_the_summary_aggregates_and_inside_their_intervals():
    personas = [f"p{i // 3}" for i in range(len(VARIED))]  # 4 personas of 3
    got = prf_intervals(VARIED, personas)
    for aggregate, expected in (("micro", micro(VARIED)), ("macro", macro(VARIED))):
        for name in ("precision", "recall", "f1"):
            interval = got[f"{aggregate}_{name}"]
            assert interval.estimate == pytest.approx(getattr(expected, name))
            assert interval.low < interval.estimate < interval.high
            assert 0.0 <= interval.low and interval.high <= 1.0
            assert (interval.n, interval.personas) == (len(VARIED), 4)
            assert not interval.resolved and "no interval: 4 personas" in interval.text(100)
    # As published (the minimum applied): the estimate only, no bounds as numbers.
    published = intervals(personas, np.array([prf_row(c) for c in VARIED]), prf)["micro_f1"]
    assert (published.low, published.high, published.half_width) == (None, None, None)
    assert published.text(100) == f"{100 * micro(VARIED).f1:.1f} (no interval: 4 personas, <{stats.MIN_PERSONAS})"


def test_interval_narrows_with_more_personas_of_the_same_kind():
    small = prf_intervals(VARIED)
    large = prf_intervals(VARIED * 16)
    for name in ("micro_f1", "macro_f1"):
        assert large[name].estimate == pytest.approx(small[name].estimate)
        # 16x the personas: about a quarter of the width (1/sqrt(16)); well under half in any case.
        assert large[name].half_width < 0.5 * small[name].half_width
    scores = [1, 3, 4, 4, 5, 6, 7, 7, 8, 10]
    assert mean_interval(scores * 16).half_width < 0.5 * mean_interval(scores).half_width
    assert (
        mean_interval(scores).resolved
        and mean_interval(scores).text()
        == f"{np.mean(scores):.1f} [{mean_interval(scores).low:.1f}, {mean_interval(scores).high:.1f}]"
    )


def test_same_units_same_interval_in_any_order_other_seed_other_draws():
    personas = [f"p{i}" for i in range(len(VARIED))]
    assert prf_intervals(VARIED, personas) == prf_intervals(VARIED[::-1], personas[::-1])
    other = prf_intervals(VARIED, seed=1)["micro_f1"]
    assert (other.low, other.high) != (prf_intervals(VARIED)["micro_f1"].low, prf_intervals(VARIED)["micro_f1"].high)
    assert other.estimate == prf_intervals(VARIED)["micro_f1"].estimate


def test_agrees_with_scipy_percentile_bootstrap_on_the_mean():
    values = np.random.default_rng(7).integers(1, 11, size=60).astype(float)  # judge scores 1..10
    ours = mean_interval(values, n_resamples=5000)
    theirs = bootstrap(
        (values,), np.mean, n_resamples=5000, method="percentile", confidence_level=0.95, rng=np.random.default_rng(3)
    )
    # Two independent Monte Carlo draws of the same percentile interval: ends agree to a small fraction of the width.
    width = theirs.confidence_interval.high - theirs.confidence_interval.low
    assert ours.low == pytest.approx(theirs.confidence_interval.low, abs=0.1 * width)
    assert ours.high == pytest.approx(theirs.confidence_interval.high, abs=0.1 * width)


def test_degenerate_inputs():
    one = prf_intervals([MatchCounts(1.0, 2, 1.5, 2)])
    assert (one["micro_precision"].low, one["micro_precision"].estimate, one["micro_precision"].high) == (0.5, 0.5, 0.5)
    assert one["micro_f1"].low == pytest.approx(one["micro_f1"].high) == pytest.approx(one["micro_f1"].estimate)
    # An empty inferred checklist scores precision 0 (as matcher.scores does), never a division error.
    empty = prf_intervals([MatchCounts(0.0, 0, 0.0, 3), PERFECT])
    assert empty["micro_precision"].estimate == micro([MatchCounts(0.0, 0, 0.0, 3), PERFECT]).precision
    assert prf_intervals([]) == {} and mean_interval([]) is None
    assert paired([], np.zeros((0, 2)), np.zeros((0, 2)), mean_score) == {} and holm([]) == []


def test_paired_difference_is_b_minus_a_of_the_figures_and_zero_when_nothing_changed():
    rng = np.random.default_rng(1)
    personas = [f"p{i // 3}" for i in range(60)]
    a = np.array([[s, 1.0] for s in rng.integers(1, 11, 60)])
    b = np.array([[s, 1.0] for s in rng.integers(1, 11, 60)])
    d = paired(personas, a, b, mean_score)["mean_score"]
    assert (d.a, d.b, d.difference) == pytest.approx((a[:, 0].mean(), b[:, 0].mean(), b[:, 0].mean() - a[:, 0].mean()))
    assert d.low < d.difference < d.high and (d.n, d.personas) == (60, 20) and d.resolved
    same = paired(personas, a, a, mean_score)["mean_score"]  # the cache answered both runs
    assert (same.difference, same.low, same.high, same.p_value, same.detectable) == (0.0, 0.0, 0.0, 1.0, None)
    # Under the minimum of personas: the difference, and no interval, p-value or power as numbers.
    few = paired(personas[: 3 * (stats.MIN_PERSONAS - 1)], a[:27], b[:27], mean_score)["mean_score"]
    assert few.personas == stats.MIN_PERSONAS - 1 and (few.low, few.high, few.p_value, few.detectable) == (None,) * 4
    # The p-value and the interval are one t test: p < .05 exactly when the interval excludes 0.
    assert (d.p_value < 0.05) == (d.low > 0 or d.high < 0)
    # Holm: the smallest p times the number of tests, then step-down, never above 1 nor below the raw p.
    assert holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    from statsmodels.stats.multitest import multipletests

    for many in (rng.uniform(size=86), rng.uniform(size=7) ** 4, np.array([0.2, 0.2, 0.01, 0.2])):
        assert holm(list(many)) == pytest.approx(list(multipletests(many, method="holm")[1]))


# ---------------------------------------------------------------- CUPID-shaped runs, simulated

N_PERSONAS, PER_PERSONA, N_PAIRS = 252, 3, 1000
ALPHA = 0.05  # two-sided 95%: REGRESSION is the lower tail, 2.5% under no change


def simulate(rng, n_personas, drop=0.0, change_law=None):
    """Unit counts of two runs A and B of one benchmark: each persona has an ability and a change between the
    runs that its three instances share (what makes units cluster), each instance a difficulty both runs meet,
    and checklists of 3-6 items labelled 0 / 0.5 / 1. `drop` removes that share of B's matched mass, so B's
    micro P, R and F1 are (1 - drop) times what they would be."""
    n = n_personas * PER_PERSONA
    persona = np.repeat(np.arange(n_personas), PER_PERSONA)
    logit = rng.normal(0, 1.0, n_personas)[persona] + rng.normal(0, 0.3, n)
    change = (change_law or (lambda rng, n: rng.normal(0, 1.2, n)))(rng, n_personas)[persona]  # the persona's B - A
    runs = []
    for shift in (np.zeros(n), change):
        q = 1 / (1 + np.exp(-(logit + shift)))
        n_pred, n_true = rng.integers(3, 7, n), rng.integers(3, 7, n)
        runs.append(
            np.stack([rng.binomial(2 * n_pred, q) / 2, n_pred, rng.binomial(2 * n_true, q) / 2, n_true], axis=1).astype(
                float
            )
        )
    a, b = runs
    b[:, [0, 2]] *= 1 - drop
    return persona, columns(a), columns(b)


def columns(counts):
    """`prf_row` of each row of counts, at numpy's speed (checked against it below)."""
    return prf_columns(counts)


def micro_f1(run):
    return prf(run.sum(axis=0))["micro_f1"]


def headline(sums):
    """The headline alone (the simulation asks for nothing else: `prf`'s micro F1, 3 of its 7 ratios)."""
    return {"micro_f1": inference.micro_f1(sums)}


def test_the_simulations_columns_are_each_units_own_to_the_bit():
    counts = np.random.default_rng(3).integers(0, 7, size=(500, 4)) / [2, 1, 2, 1]
    counts[:3] = [[0, 0, 0, 3], [1, 2, 0, 0], [0, 4, 0, 5]]  # nothing predicted; no truth; a preference missed
    rows = np.array([prf_row(MatchCounts(*row)) for row in counts])
    assert np.array_equal(prf_columns(counts), rows) and rows[:, -1].any() and not rows[:, -1].all()


def test_the_headline_is_prfs_micro_f1():
    sums = np.random.default_rng(7).uniform(0, 30, size=(50, len(PRF_COLUMNS)))
    sums[3, 1] = sums[4, 3] = 0.0  # nothing predicted; no truth: the ratios' zero cases
    assert np.array_equal(headline(sums)["micro_f1"], prf(sums)["micro_f1"])


@pytest.mark.slow  # ~17 s (3,000 bootstrapped comparisons of simulated runs): `make test` runs it
def test_simulated_comparisons_have_the_stated_error_rates():
    rng = np.random.default_rng(20251125)
    # The truth: micro F1 of A and of B on a population of personas far larger than the benchmark's.
    _, big_a, big_b = simulate(rng, 100_000)
    np.testing.assert_allclose(big_a[:20], [prf_row(MatchCounts(*row[:4])) for row in big_a[:20]])
    truth_null = micro_f1(big_b) - micro_f1(big_a)

    null = [simulate(rng, N_PERSONAS) for _ in range(N_PAIRS)]
    results = [paired(names, a, b, headline)["micro_f1"] for names, a, b in null]

    # Units cluster: the persona-resampled spread of the difference is >= 1.5x the spread resampling instances.
    names, a, b = null[0]
    units = np.arange(len(names))
    clustered, naive = paired(names, a, b, headline)["micro_f1"], paired(units, a, b, headline)["micro_f1"]
    assert clustered.detectable >= 1.5 * naive.detectable  # detectable = (1.96 + 0.84) x the bootstrap s.d.

    # No real change: one-sided REGRESSION (the interval below 0, p < 0.05 two-sided) in <= 4.5% (2.5% expected).
    assert abs(truth_null) < 0.002  # the change is symmetric on the logit scale: no change in expectation
    assert sum(r.high < 0 for r in results) / N_PAIRS <= 0.045

    # The drop theory gives 80% power for: (1.96 + 0.84) x the sampling s.d. of the difference.
    sd = np.std([r.difference for r in results])
    drop_f1 = (1.96 + 0.84) * sd
    drop = drop_f1 / micro_f1(big_a)
    truth = micro_f1(big_b * np.where(np.isin(np.arange(len(PRF_COLUMNS)), [0, 2]), 1 - drop, 1)) - micro_f1(big_a)
    dropped = [simulate(rng, N_PERSONAS, drop) for _ in range(N_PAIRS)]
    found = [paired(names, a, b, headline)["micro_f1"] for names, a, b in dropped]
    assert sum(r.high < 0 for r in found) / N_PAIRS >= 0.75
    assert np.mean([r.detectable for r in found]) == pytest.approx(drop_f1, rel=0.15)  # `detectable` estimates it

    # Coverage of the true difference: persona-resampled 92-97.5%; resampling instances on the same data < 92%.
    covered = np.mean([r.low <= truth <= r.high for r in found])
    naive_covered = np.mean(
        [r.low <= truth <= r.high for _, a, b in dropped for r in [paired(units, a, b, headline)["micro_f1"]]]
    )
    assert 0.92 <= covered <= 0.975, covered
    assert naive_covered < 0.92, naive_covered
    assert stats.MIN_PERSONAS <= N_PERSONAS


def heavy_tailed(rng, n):
    """Persona-level changes from a t law with 3 degrees of freedom: a few personas move a lot."""
    return 0.7 * rng.standard_t(3, n)


def test_the_minimum_of_personas_keeps_the_stated_level_under_heavy_tailed_changes():
    # 2,000 no-change pairs at the minimum, each side's false flags counted: one-sided 2.5% nominal, <= 3.5% held.
    # The percentile interval this replaced flagged 4.8% here (5.7% in the simulation).
    rng = np.random.default_rng(46)
    flags = {"below": 0, "above": 0}
    for _ in range(2000):
        d = paired(*simulate(rng, stats.MIN_PERSONAS, change_law=heavy_tailed), headline)["micro_f1"]
        flags["below"] += d.high < 0
        flags["above"] += d.low > 0
    rates = {side: n / 2000 for side, n in flags.items()}
    print(f"one-sided false flags at {stats.MIN_PERSONAS} personas: {rates}")
    assert max(rates.values()) <= 0.035, rates
    assert min(rates.values()) >= 0.005, rates  # a level, not a test that never fires


INFERENCE_SETTINGS = ("standard", "oracle", "summary")
GENERATION_SETTINGS = ("standard", "oracle", "summary", "oracle-preference")


def scores(rng, n_personas, lower=0.0):
    """Judge scores 1-10 of two runs: a persona's level, a persona-level change, an instance's noise; B `lower`."""
    n = n_personas * PER_PERSONA
    persona = np.repeat(np.arange(n_personas), PER_PERSONA)
    level = 6 + rng.normal(0, 1.5, n_personas)[persona]
    a = np.clip(np.round(level + rng.normal(0, 1.5, n)), 1, 10)
    b = np.clip(np.round(level + rng.normal(0, 0.8, n_personas)[persona] + rng.normal(0, 1.5, n)), 1, 10) - lower
    return [np.column_stack([x, np.ones(n)]) for x in (a, b)]


def every_setting(rng, drop=0.0, lower=0.0):
    """The rows of one comparison of two whole runs (inference in 3 settings, generation in 4), adjusted."""
    from cupid.eval.benchmark.data import INSTANCE_TYPES
    from cupid.eval.benchmark.generation import GENERATION
    from cupid.eval.benchmark.inference import INFERENCE
    from cupid.eval.results.compare import adjust, task_rows

    names = [f"p{i:03d}" for i in np.repeat(np.arange(N_PERSONAS), PER_PERSONA)]
    types = list(INSTANCE_TYPES) * N_PERSONAS
    rows = []
    for setting in INFERENCE_SETTINGS:
        _, a, b = simulate(rng, N_PERSONAS, drop)
        rows += task_rows(INFERENCE, setting, names, types, a, b, headline=setting == "standard")
    for setting in GENERATION_SETTINGS:
        a, b = scores(rng, N_PERSONAS, lower)
        rows += task_rows(GENERATION, setting, names, types, a, b, headline=setting == "standard")
    adjust(rows)
    return rows


@pytest.mark.slow  # ~45 s (430 simulated comparisons of two whole runs): `make test` runs it
def test_holm_over_a_whole_comparison_has_power_at_the_family_wise_level():
    rng = np.random.default_rng(4646)
    _, big_a, _ = simulate(rng, 100_000)
    drop = 0.10 / micro_f1(big_a)  # B's micro F1 10 points lower (micro F1 scales with the matched mass)
    found = [every_setting(rng, drop, lower=1.0) for _ in range(30)]
    assert len(found[0]) == 3 * 4 * len(inference.INFERENCE.metrics) + 4 * 4 and sum(r.headline for r in found[0]) == 2
    wanted = [
        [r for r in rows if r.metric in ("micro_f1", "micro_recall", "macro_f1", "macro_recall", "mean_score")]
        for rows in found
    ]
    power = np.mean([np.mean([r.p_holm < ALPHA for r in rows]) for rows in wanted])
    print(f"rows found at p_holm < .05 (a drop of 10 F1 points, of 1 judge point): {power:.3f}")
    assert power >= 0.90, power
    # The simulated B keeps micro F1 but spreads the personas' abilities (a change of mean 0 in logit), so it misses
    # a preference entirely about twice as often as A: `missed` truly changes, and is left out of the null's rows.
    null = [[r for r in every_setting(rng) if r.metric != "missed"] for _ in range(400)]
    for family in (True, False):  # the headline tests, and every other row: each a family of its own
        flagged = np.mean([any(r.p_holm < ALPHA for r in rows if r.headline == family) for rows in null])
        print(f"no-change comparisons with a {'headline' if family else 'other'} row at p_holm < .05: {flagged:.3f}")
        assert flagged <= 0.05 + 0.015, (family, flagged)  # 5% nominal; 400 pairs: 1.1 points of sampling s.d.
