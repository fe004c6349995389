"""The night's rule on its own, without a night, on plain values: which night a candidate is compared with
(`baseline_of`), what its comparisons say (`changes_of`, where there is no run to compare with), and what the night's
one family of headline tests decides (`flag_regressions`): its flags at the family's level, the horizon's share of
it, and whether tonight becomes a baseline."""

from dataclasses import fields

from cupid.eval.benchmark.stats import GATE_ALPHA
from cupid.eval.results.compare import Row
from cupid.eval.results.leaderboard import FIRST_NIGHT, Entry
from cupid.eval.results.regressions import Changes, Decision, baseline_of, changes_of, flag_regressions

F1 = "inference/standard/micro_f1"
NIGHT = "2025-08-02"


def headline(e_value: float, personas: int = 80) -> Row:
    """A gated headline test whose e-value is `e_value` (p = 1/e), as a comparison leaves it before the family."""
    return Row(task="inference", setting="standard", instance_type=None, metric="micro_f1", a=0.4, b=0.3,
               difference=-0.1, low=-0.15, high=-0.05, p_value=min(1.0, 1 / e_value), se=0.02, detectable=None,
               n=3 * personas, personas=personas, headline=True, e_value=e_value)  # fmt: skip


def changes(e_value: float | None = None, **settled) -> Changes:
    """A candidate's comparisons with one headline test since last night (none without `e_value`)."""
    change = {F1: headline(e_value)} if e_value is not None else {}
    return Changes(change=change, baseline="2025-08-01", **settled)


def test_the_baseline_is_the_recorded_night_unless_the_file_names_a_later_one():
    recorded = Entry(model="m", primary=F1, baseline="2025-08-01")
    assert baseline_of(None, None) is None  # never ran, none named: its first night will be
    assert baseline_of(None, recorded) == "2025-08-01"
    assert baseline_of("2025-08-05", recorded) == "2025-08-05"  # a later night named wins
    assert baseline_of("2025-07-01", recorded) == "2025-08-01"  # an earlier one does not undo a newer baseline
    assert baseline_of("2025-07-01", None) == "2025-07-01"
    unset = Entry(model="m", primary=F1)  # an entry that records no baseline: as if it never ran
    assert baseline_of(None, unset) is None and baseline_of("2025-07-01", unset) == "2025-07-01"


def test_a_test_is_flagged_at_the_familys_level_and_no_other():
    (collapsed, steady), level = flag_regressions([changes(1e6), changes(1.0)], NIGHT)
    assert collapsed.regressions == [F1] and steady.regressions == []
    assert level.startswith("2 headline test(s) on 80 personas") and "at most 2.5%" in level


def test_the_family_and_the_horizon_each_raise_the_bar():
    # e = 50 (p = 0.02): under 0.025 alone; not in a family of two (Holm's 0.0125), nor alone over a horizon of 2.
    (alone,), _ = flag_regressions([changes(50.0)], NIGHT)
    assert alone.regressions == [F1]
    paired, _ = flag_regressions([changes(50.0), changes(50.0)], NIGHT)
    assert [d.regressions for d in paired] == [[], []]
    stretched = changes(50.0)
    (decision,), level = flag_regressions([stretched], NIGHT, horizon=2)
    assert decision.regressions == [] and stretched.change[F1].alpha == GATE_ALPHA / 2
    assert "any over 2 nights at most 2.5%" in level


def test_a_test_without_enough_personas_or_with_no_verdict_is_not_in_the_family():
    few = Changes(change={F1: headline(1e6, personas=79)}, baseline="2025-08-01")
    silent = changes(1e6, no_verdict=["not the same evaluation: differs: data"])
    decisions, level = flag_regressions([few, silent], NIGHT)
    assert level == ""  # no test: no level to state
    assert [d.regressions for d in decisions] == [[], []]


def test_the_baseline_side_is_in_the_family_where_it_has_a_verdict():
    drifted = Changes(baseline="2025-08-01", baseline_change={F1: headline(1e6)})
    unjudged = Changes(baseline="2025-08-01", baseline_change={F1: headline(1e6)}, baseline_no_verdict=["too few"])
    (drifted_decision, unjudged_decision), level = flag_regressions([drifted, unjudged], NIGHT)
    assert (drifted_decision.regressions, drifted_decision.baseline_regressions) == ([], [F1])
    assert (unjudged_decision.baseline_regressions, unjudged_decision.baseline_no_verdict) == ([], ["too few"])
    assert level.startswith("1 headline test(s)")


def test_tonight_becomes_the_baseline_only_unflagged_and_with_a_verdict():
    new = changes(1.0, pending=FIRST_NIGHT)
    flagged = changes(1e6, pending="its setup changed since 2025-08-01")
    stuck = changes(None, pending="no run of 2025-08-01", no_verdict=["a judge failed on 5%"])
    moved = changes(None, pending="its setup changed", no_verdict=["x"], setup_changed=["judge"])
    (new_, flagged_, stuck_, moved_), _ = flag_regressions([new, flagged, stuck, moved], NIGHT)
    assert (new_.baseline, new_.baseline_set) == (NIGHT, FIRST_NIGHT)
    assert flagged_.baseline == "2025-08-01" and flagged_.baseline_no_verdict == [
        "tonight was flagged: it does not become the baseline"
    ]
    assert stuck_.baseline == "2025-08-01" and stuck_.baseline_no_verdict == [
        "no verdict since last night: tonight does not become the baseline"
    ]
    assert (moved_.baseline, moved_.baseline_set) == (NIGHT, "its setup changed")  # why it asked: it moves on
    # what tonight asked is the decision's input only: no entry or decision carries it past the night
    assert "baseline_pending" not in Entry.model_fields and "pending" not in {f.name for f in fields(Decision)}


def test_a_flagged_night_never_becomes_the_baseline_by_either_side():
    since_baseline = Changes(baseline="2025-08-01", baseline_change={F1: headline(1e6)}, pending="setup changed")
    unanswered = changes(1.0, pending=FIRST_NIGHT, unanswered=["since 2025-08-01: 3% more units unanswered"])
    first = Changes(change={F1: headline(1e6)}, pending=FIRST_NIGHT)  # no baseline yet: it keeps none
    decisions, _ = flag_regressions([since_baseline, unanswered, first], NIGHT)
    assert [(d.baseline, d.baseline_set) for d in decisions] == [
        ("2025-08-01", None),
        ("2025-08-01", None),
        (None, None),
    ]
    assert all(d.baseline_no_verdict[-1] == "tonight was flagged: it does not become the baseline" for d in decisions)


def test_a_night_without_a_verdict_since_last_night_does_not_become_the_baseline():
    # its comparison's reason kept first, the decision's added after it; the value it was decided from left as it was
    stuck = Changes(
        baseline="2025-08-01", no_verdict=["too few personas"], baseline_no_verdict=["no run of 2025-08-01"],
        pending="no run of 2025-08-01",
    )  # fmt: skip
    (decision,), _ = flag_regressions([stuck], NIGHT)
    assert (decision.baseline, decision.baseline_set, decision.regressions) == ("2025-08-01", None, [])
    assert decision.baseline_no_verdict == [
        "no run of 2025-08-01",
        "no verdict since last night: tonight does not become the baseline",
    ]
    assert stuck.baseline_no_verdict == ["no run of 2025-08-01"]


def test_a_candidate_that_did_not_ask_keeps_its_baseline_and_its_reasons():
    kept = changes(1e6, baseline_no_verdict=["its setup changed since 2025-08-01"])
    (decision,), _ = flag_regressions([kept], NIGHT)
    assert decision == Decision(
        regressions=[F1], baseline="2025-08-01", baseline_no_verdict=["its setup changed since 2025-08-01"]
    )


def test_changes_and_decision_settle_every_entry_field_the_run_does_not_once():
    run = {"model", "run_dir", "primary", "error", "status", "served", "server_error", "identity", "metrics",
           "n_scored", "n_failed", "failures", "requests", "wall_s"}  # fmt: skip
    settled, decided = set(Changes().entry_fields()), set(Decision().entry_fields())
    assert not (run & settled or run & decided or settled & decided)
    assert run | settled | decided == set(Entry.model_fields)


def test_compare_without_runs_says_why_there_is_no_test(tmp_path):
    first = changes_of("m", {F1}, None, None, None, NIGHT, tmp_path)
    assert first == Changes(pending=FIRST_NIGHT)  # never ran: tonight asks to be its baseline
    skipped = changes_of("m", {F1}, None, None, "2025-07-01", NIGHT, tmp_path, last_night="2025-08-01", first=False)
    assert skipped == Changes(
        no_previous="not in 2025-08-01: no test since last night",
        baseline="2025-07-01",
        baseline_no_verdict=["no run of 2025-07-01"],
        pending="no run of 2025-07-01",
    )
    down = Entry(model="m", primary=F1, status="error", error="no server")
    after_down = changes_of("m", {F1}, None, down, "2025-08-01", NIGHT, tmp_path, last_night="2025-08-01", first=False)
    assert after_down == Changes(
        previous={}, no_previous="did not run on 2025-08-01: no test since last night", baseline="2025-08-01"
    )  # its baseline is last night: one comparison serves both
