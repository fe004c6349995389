"""The night's rule on its own, without a night: which night a candidate is compared with (`baseline_of`), and what
the night's one family of headline tests decides (`flag_regressions`): its flags at the family's level, the horizon's
share of it, and whether tonight becomes a baseline."""

from cupid.eval.benchmark.stats import GATE_ALPHA
from cupid.eval.results.compare import Row
from cupid.eval.results.leaderboard import FIRST_NIGHT, Entry
from cupid.eval.results.regressions import baseline_of, flag_regressions

F1 = "inference/standard/micro_f1"
NIGHT = "2025-08-02"


def headline(e_value: float, personas: int = 80) -> Row:
    """A gated headline test whose e-value is `e_value` (p = 1/e), as a comparison leaves it before the family."""
    return Row(task="inference", setting="standard", instance_type=None, metric="micro_f1", a=0.4, b=0.3,
               difference=-0.1, low=-0.15, high=-0.05, p_value=min(1.0, 1 / e_value), se=0.02, detectable=None,
               n=3 * personas, personas=personas, headline=True, e_value=e_value)  # fmt: skip


def entry(name: str, e_value: float | None = None, **fields) -> Entry:
    change = {F1: headline(e_value)} if e_value is not None else {}
    return Entry(model=name, primary=F1, change=change, baseline="2025-08-01", **fields)


def test_the_baseline_is_the_recorded_night_unless_the_file_names_a_later_one():
    recorded = Entry(model="m", primary=F1, baseline="2025-08-01")
    assert baseline_of(None, None) is None  # never ran, none named: its first night will be
    assert baseline_of(None, recorded) == "2025-08-01"
    assert baseline_of("2025-08-05", recorded) == "2025-08-05"  # a later night named wins
    assert baseline_of("2025-07-01", recorded) == "2025-08-01"  # an earlier one does not undo a newer baseline
    assert baseline_of("2025-07-01", None) == "2025-07-01"


def test_a_test_is_flagged_at_the_familys_level_and_no_other():
    collapsed, steady = entry("collapsed", 1e6), entry("steady", 1.0)
    level = flag_regressions([collapsed, steady], NIGHT)
    assert collapsed.regressions == [F1] and steady.regressions == []
    assert level.startswith("2 headline test(s) on 80 personas") and "at most 2.5%" in level


def test_the_family_and_the_horizon_each_raise_the_bar():
    # e = 50 (p = 0.02): under 0.025 alone; not in a family of two (Holm's 0.0125), nor alone over a horizon of 2.
    alone = entry("alone", 50.0)
    flag_regressions([alone], NIGHT)
    assert alone.regressions == [F1]
    paired = [entry("first", 50.0), entry("second", 50.0)]
    flag_regressions(paired, NIGHT)
    assert [e.regressions for e in paired] == [[], []]
    stretched = entry("stretched", 50.0)
    level = flag_regressions([stretched], NIGHT, horizon=2)
    assert stretched.regressions == [] and stretched.change[F1].alpha == GATE_ALPHA / 2
    assert "any over 2 nights at most 2.5%" in level


def test_a_test_without_enough_personas_or_with_no_verdict_is_not_in_the_family():
    few = entry("few")
    few.change = {F1: headline(1e6, personas=79)}
    silent = entry("silent", 1e6, no_verdict=["not the same evaluation: differs: data"])
    assert flag_regressions([few, silent], NIGHT) == ""  # no test: no level to state
    assert few.regressions == [] and silent.regressions == []


def test_tonight_becomes_the_baseline_only_unflagged_and_with_a_verdict():
    new = entry("new", 1.0, baseline_pending=FIRST_NIGHT)
    flagged = entry("flagged", 1e6, baseline_pending="its setup changed since 2025-08-01")
    stuck = entry("stuck", None, baseline_pending="no run of 2025-08-01", no_verdict=["a judge failed on 5%"])
    moved = entry("moved", None, baseline_pending="its setup changed", no_verdict=["x"], setup_changed=["judge"])
    flag_regressions([new, flagged, stuck, moved], NIGHT)
    assert (new.baseline, new.baseline_set) == (NIGHT, FIRST_NIGHT)
    assert flagged.baseline == "2025-08-01" and flagged.baseline_no_verdict == [
        "tonight was flagged: it does not become the baseline"
    ]
    assert stuck.baseline == "2025-08-01" and stuck.baseline_no_verdict == [
        "no verdict since last night: tonight does not become the baseline"
    ]
    assert (moved.baseline, moved.baseline_set) == (NIGHT, "its setup changed")  # why it asked: it moves on
    assert all(e.baseline_pending is None for e in (new, flagged, stuck, moved))
