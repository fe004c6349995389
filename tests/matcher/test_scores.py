import pytest

from cupid.matcher.scores import MatchCounts, macro, micro

F, P, N = "Fully Covered", "Partially Covered", "Not Covered"


def test_instance_scores_by_hand():
    counts = MatchCounts.from_labels([F, P], [N, N, F])
    assert (counts.predicted_matched, counts.n_predicted, counts.true_matched, counts.n_true) == (1.5, 2, 1.0, 3)
    prf = counts.prf()
    assert prf.precision == pytest.approx(0.75)
    assert prf.recall == pytest.approx(1 / 3)
    assert prf.f1 == pytest.approx(2 * 0.75 * (1 / 3) / (0.75 + 1 / 3))


def test_micro_and_macro_differ_as_computed_by_hand():
    a = MatchCounts.from_labels([F, P], [N, N, F])  # P=.75, R=1/3
    b = MatchCounts.from_labels([F], [P, P])  # P=1, R=.5
    mi = micro([a, b])
    assert mi.precision == pytest.approx(2.5 / 3)
    assert mi.recall == pytest.approx(2 / 5)
    assert mi.f1 == pytest.approx(2 * (2.5 / 3) * 0.4 / (2.5 / 3 + 0.4))
    ma = macro([a, b])
    assert ma.precision == pytest.approx((0.75 + 1) / 2)
    assert ma.recall == pytest.approx((1 / 3 + 0.5) / 2)
    f1_a = 2 * 0.75 * (1 / 3) / (0.75 + 1 / 3)
    f1_b = 2 * 1 * 0.5 / 1.5
    assert ma.f1 == pytest.approx((f1_a + f1_b) / 2)
    assert ma.f1 != pytest.approx(mi.f1)


def test_an_empty_inferred_checklist_scores_zero():
    empty = MatchCounts(0.0, 0, 0.0, 3)
    assert empty.prf().as_dict() == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


def test_nothing_to_aggregate_is_none_not_zero():
    assert micro([]) is None and macro([]) is None
