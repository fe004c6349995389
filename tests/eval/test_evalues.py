"""The gate's e-value: what it is (a mixture of constant bets' wealths), what makes it valid (no wealth without a
drop, whatever the order), and that a change no run could show is never a regression."""

import math

import numpy as np
import pytest

from cupid.eval.benchmark import evalues
from cupid.eval.benchmark.generation import GENERATION
from cupid.eval.results.compare import holm_family, task_rows


def test_the_e_value_is_the_mean_wealth_of_its_constant_bets():
    changes = np.random.default_rng(1).uniform(-1, 1, size=40)
    margin = 0.02
    bets = ((np.arange(evalues.BETS) + 0.5) / evalues.BETS) ** (1 / 3) / (1 + margin)
    wealths = [math.prod(1 + lam * (-margin - x) for x in changes) for lam in bets]
    assert evalues.e_value(changes, margin) == pytest.approx(sum(wealths) / len(wealths), rel=1e-9)
    assert 1 + bets.max() * (-margin - 1.0) > 0  # a persona gaining the whole range leaves some wealth


def test_no_change_earns_nothing_and_the_order_of_personas_does_not_matter():
    assert evalues.e_value(np.zeros(252)) == pytest.approx(1.0)
    assert evalues.p_value(evalues.e_value(np.zeros(252))) == 1.0
    rng = np.random.default_rng(2)
    changes = np.where(rng.uniform(size=252) < 0.1, -0.3, 0.0)
    assert evalues.e_value(changes) == pytest.approx(evalues.e_value(rng.permutation(changes)))
    assert evalues.e_value(changes) > 100 > 1 > evalues.e_value(-changes)  # a drop earns; a gain loses


def test_a_drop_within_the_margin_earns_nothing():
    changes = np.full(252, -0.01)  # every persona 1 point lower
    assert evalues.e_value(changes, margin=0.01) == pytest.approx(1.0)
    # Without the margin it earns, but little: 252 personas each 1 point lower is what a law where 1% of the personas
    # gain the whole range shows 8% of the time, so no test valid for every law of changes in [-1, 1] can go under
    # p = 0.08 on it.
    assert 1 / 0.08 > evalues.e_value(changes, margin=0.0) > 5


def test_a_uniform_change_below_any_runs_resolution_is_no_regression():
    # Every unit 1e-9 judge points lower: no spread, but nothing any run could show; the bootstrap-t's absolute
    # 1e-12 cutoff called it a certain regression.
    rng = np.random.default_rng(3)
    names = np.repeat([f"p{i:03d}" for i in range(100)], 3)
    types = np.tile(("consistent", "contrastive", "changing"), 100)
    a = np.column_stack([rng.integers(1, 11, 300).astype(float), np.ones(300)])
    b = a.copy()
    b[:, 0] -= 1e-9
    rows = [r for r in task_rows(GENERATION, "standard", names, types, a, b, headline=True) if r.headline]
    holm_family(rows)
    assert rows[0].e_value == pytest.approx(1.0) and not rows[0].regression


def test_detectable_is_none_without_spread_and_grows_with_the_family():
    assert evalues.detectable(np.zeros(100), 0.0, 0.025, 0.8) is None
    changes = np.random.default_rng(4).normal(0, 0.15, 252)
    one, many = (evalues.detectable(changes, 0.0, 0.025 / m, 0.8) for m in (1, 80))
    assert one is not None and many is not None and 0 < one < many < 0.2
