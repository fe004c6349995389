"""The gate's level where a nightly meets it most: a sparse change (most personas answer as before; a few gain a lot,
more lose a little, netting to no change), through the comparison's own rows (`task_rows`, `holm_family`), a family
of 20 headline tests a night. The bootstrap-t the gate used before flagged such a family 11% of the time; the betting
e-value holds the level by construction. Its own file, so that it runs beside test_stats.py on another worker."""

import numpy as np
import pytest

from cupid.eval.benchmark import stats
from cupid.eval.benchmark.generation import GENERATION
from cupid.eval.results.compare import holm_family, task_rows

pytestmark = pytest.mark.slow  # ~20 s: the whole suite runs it, `make check` does not

TYPES = ("consistent", "contrastive", "changing")


def sparse_pair(rng: np.random.Generator, personas: int, gain: float = 4.0, loss: float = 1.0, share: float = 0.02):
    """Two runs' judge scores (three units a persona, 3-6 in A): `share` of the personas gain `gain` on each unit in
    B, `share * gain / loss` lose `loss`, the rest answer exactly as before: the personas' mean change is 0."""
    a = rng.uniform(3, 6, size=(personas, 3))
    u = rng.uniform(size=(personas, 1))
    change = np.where(u < share, gain, np.where(u < share + share * gain / loss, -loss, 0.0))
    names = np.repeat([f"p{i:03d}" for i in range(personas)], 3)
    ones = np.ones((3 * personas, 1))
    columns = [np.hstack([s.reshape(-1, 1), ones]) for s in (a, a + change)]
    return names, np.tile(TYPES, personas), columns[0], columns[1]


def family_flags(rng: np.random.Generator, tests: int, personas: int) -> int:
    """How many of a family's `tests` independent null comparisons the gate flags as REGRESSION."""
    rows = []
    for _ in range(tests):
        names, types, a, b = sparse_pair(rng, personas)
        rows += [r for r in task_rows(GENERATION, "standard", names, types, a, b, headline=True) if r.headline]
    holm_family(rows)
    return sum(r.regression for r in rows)


def test_a_family_of_twenty_keeps_its_level_under_a_sparse_change_netting_to_zero():
    # 150 nights of 20 null tests at 138 personas: a night with any false REGRESSION at most 2.5% of the time
    # (3.75 of 150). The bootstrap-t with Holm stepping at 0.035/k^1.5 flagged 96 of these 150 nights (64%).
    rng = np.random.default_rng(74)
    nights = [family_flags(rng, 20, 138) > 0 for _ in range(150)]
    print(f"nights with a false REGRESSION: {sum(nights)} of {len(nights)}")
    assert sum(nights) <= stats.GATE_ALPHA * len(nights)


def test_the_same_family_finds_a_real_drop():
    # Two fifths of the personas lose 2 points on each unit (a drop of 0.8 judge points), the rest answer as before:
    # in a family of 20, which a gate that never fires would miss.
    rng = np.random.default_rng(75)
    names, types, a, _ = sparse_pair(rng, 138)
    b = a.copy()
    b[:, 0] -= 2 * np.repeat(rng.uniform(size=138) < 0.4, 3)
    rows = [r for r in task_rows(GENERATION, "standard", names, types, a, b, headline=True) if r.headline]
    holm_family(rows * 20)  # the same test 20 times: the family's smallest threshold, 0.025/20
    assert rows[0].persona_change < -0.5 and rows[0].regression
