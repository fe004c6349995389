"""`cupid compare` on real runs: the random-weight model's answers (held to the task's format, so they parse) against
the instant server's, scored by the same judges, then a run whose decomposer changed."""

import json
import re
import shutil

import pytest
from typer.testing import CliRunner

from cupid.cli import app
from cupid.common.errors import EXIT_NO_VERDICT, EXIT_REGRESSION
from cupid.eval.benchmark.inference import INFERENCE
from cupid.eval.benchmark.records import UnitRecord
from cupid.eval.benchmark.runner import RunConfig, run
from cupid.matcher.scores import MatchCounts, macro, micro
from tests.helpers import sample_copies, write_endpoints


@pytest.fixture(scope="module")
def runs(tmp_path_factory, instant_url, tiny_server, session_home):
    """Runs A (the random model), B (the instant server) and C (B's candidate, another decomposer) of one sample."""
    home = tmp_path_factory.mktemp("compare")
    endpoints = write_endpoints(
        home / "endpoints.yaml",
        instant={"base_url": instant_url, "model": "instant"},
        pm={"base_url": instant_url, "model": "local-prefmatcher"},
        cand={**tiny_server, "structured_output": True, "constrain_candidate": True},
    )
    common = {
        "endpoints": str(endpoints),
        "matcher": "pm",
        "cache": str(home / "cache.sqlite"),
        "settings": ["standard", "oracle"],
    }
    made = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUPID_HOME", str(session_home))
        for name, candidate, decomposer in (
            ("a", "cand", "instant"),
            ("b", "instant", "instant"),
            ("c", "instant", "pm"),
        ):
            run(RunConfig(**common, candidate=candidate, decomposer=decomposer, out=str(home / name)))
            made[name] = home / name
    return made


def records(run_dir):
    return {
        r.unit: r
        for r in (
            UnitRecord.model_validate_json(line) for line in (run_dir / "instances.jsonl").read_text().splitlines()
        )
    }


def test_every_difference_is_b_minus_a_on_the_matched_units(runs):
    result = CliRunner().invoke(app, ["compare", str(runs["a"]), str(runs["b"]), "--json"])
    assert result.exit_code == 0, result.output
    comparison = json.loads(result.output)
    a, b = records(runs["a"]), records(runs["b"])

    def judged(r):  # scored, or the candidate's own failure (an empty answer); not a judge's failure
        return r.scored or r.error.stage in ("infer", "parse_preference")

    def counts_of(r):  # a failed candidate inferred nothing: every ground-truth item missed
        return r.match_counts() if r.scored else MatchCounts(0.0, 0, 0.0, len(r.gt_checklist))

    matched = [u for u in a if u in b and judged(a[u]) and judged(b[u])]
    assert comparison["matched"] == len(matched) > 0 and comparison["only_a"] == comparison["only_b"] == 0
    assert comparison["matched"] + sum(comparison["left_out"].values()) == len(a)
    assert comparison["no_answer"] == {
        side: n for side, n in (("a", sum(not a[u].scored for u in matched)), ("b", 0)) if n
    }
    assert comparison["differs"] == [] and comparison["personas"] == len({a[u].persona_id for u in matched})

    def figures(side, setting, group):
        counts = [counts_of(side[u]) for u in matched if u[2] == setting and group in (None, side[u].instance_type)]
        points = {"micro": micro(counts), "macro": macro(counts)}
        missed = sum(c.prf().f1 == 0 for c in counts) / len(counts)  # the share of units with F1 = 0
        prf = {f"{agg}_{name}": getattr(points[agg], name) for agg in points for name in ("precision", "recall", "f1")}
        return {**prf, "missed": missed}

    rows = comparison["rows"]
    assert {(r["setting"], r["instance_type"]) for r in rows} >= {("standard", None), ("oracle", "changing")}
    for row in rows:
        want_a, want_b = (
            figures(a, row["setting"], row["instance_type"])[row["metric"]],
            figures(b, row["setting"], row["instance_type"])[row["metric"]],
        )
        assert (row["a"], row["b"], row["difference"]) == pytest.approx((want_a, want_b, want_b - want_a))
        # 4 personas: no interval, p-value or power published as numbers
        assert (row["low"], row["high"], row["p_value"], row["p_holm"], row["detectable"]) == (None,) * 5
    headlines = [r for r in rows if r["headline"]]
    assert [(r["task"], r["setting"], r["instance_type"], r["metric"]) for r in headlines] == [
        ("inference", "standard", None, INFERENCE.headline[0])
    ]
    counts = comparison["per_unit"]["inference"]
    assert counts["better"] + counts["worse"] + counts["tied"] == len(matched)
    assert all(
        u["view"].startswith("runs/report/view.html#unit=") and u["change"] == pytest.approx(u["b"] - u["a"])
        for u in comparison["units"]
    )

    table = CliRunner().invoke(app, ["compare", str(runs["a"]), str(runs["b"])]).output
    assert (
        "inference/standard/micro_f1 *" in table and "personas (<10): no intervals" in table
    )  # the sample: 4 personas


def test_a_changed_judge_is_named(runs):
    comparison = json.loads(CliRunner().invoke(app, ["compare", str(runs["b"]), str(runs["c"]), "--json"]).output)
    assert comparison["differs"] == ["judge decomposer: instant -> local-prefmatcher"]


def test_a_run_against_itself_differs_by_nothing(runs):
    same = json.loads(CliRunner().invoke(app, ["compare", str(runs["b"]), str(runs["b"]), "--json"]).output)
    assert same["rows"]  # a row each: `all` of none would pass
    assert all((r["difference"], r["low"], r["high"], r["p_value"]) == (0.0, None, None, None) for r in same["rows"])


def test_too_few_personas_are_no_verdict_which_the_gate_does_not_pass(runs):
    """The sample's 4 personas."""
    gated = CliRunner().invoke(app, ["compare", str(runs["b"]), str(runs["b"]), "--fail-if-regression"])
    assert gated.exit_code == EXIT_NO_VERDICT, gated.output
    assert "NO VERDICT: inference/standard: 4 personas compared, fewer than 80 for a verdict" in " ".join(
        gated.output.split()
    )


def test_a_run_directory_that_does_not_exist_is_a_usage_error(runs):
    missing = CliRunner().invoke(app, ["compare", str(runs["b"]), str(runs["b"] / "nowhere")])
    assert missing.exit_code == 2 and "nowhere: no such run directory" in missing.output  # an unreadable input


# ---------------------------------------------------------------- the gate, on real runs of both tasks
# Building these runs (`gate_runs`: 11 runs of 108 personas on instant servers, ~25 s) makes each test that reads
# them slow: `make test` runs them, `make check` does not.

COPIES = 27  # the sample's 4 personas 27 times: 108 personas, 324 units per task in the standard setting; its first
# 20 copies' 240 instances hold GATE_PERSONAS (80)
UNITS = 3 * 4 * COPIES
FIFTH = r"\(case sample-\d+-(0|5|10|15|20|25)\)"  # 6 copies of 4 personas: 24 of 108
# 13 copies of 4 personas: 52 of 108 answer a preference that matches nothing (a drop the gate's test finds; with 16
# it stays under its detectable)
SOME = r"\(case sample-\d+-(\d|1[0-2])\)"


def instant_with(*args):
    from cupid.serving.servers.instant import start as start_instant

    return start_instant(*args)


@pytest.fixture(scope="module")
def gate_runs(tmp_path_factory, instant_url):
    """Runs of one candidate (the instant server) on 108 personas, both tasks, standard setting: A; A again under
    another name (the same answers); B that states no preference at all; B that states none for a fifth of the
    personas; B that states none for the personas where every answer of A matched nothing (recall 0); B that answers
    worse for 16 personas; A in the oracle setting only; A on inference only; A on the first 240 instances (80
    personas); A scored by another decomposer; and A cut short before its first record."""
    home = tmp_path_factory.mktemp("gate")
    data = sample_copies(home / "personas.jsonl", COPIES, marked=True)
    common = {
        "data": str(data),
        "decomposer": "instant",
        "matcher": "pm",
        "judge": "instant",
        "tasks": ["inference", "generation"],
        "settings": ["standard"],
        "cache": str(home / "cache.sqlite"),
    }
    servers = {}
    made = {}

    def endpoints():
        return write_endpoints(
            home / "endpoints.yaml",
            instant={"base_url": instant_url, "model": "instant"},
            again={"base_url": instant_url, "model": "instant-again"},
            pm={"base_url": instant_url, "model": "local-prefmatcher"},
            **{name: {"base_url": url, "model": name} for name, (_, url) in servers.items()},
        )

    def make(name, candidate, **extra):
        run(RunConfig(**{**common, **extra}, endpoints=str(endpoints()), candidate=candidate, out=str(home / name)))
        made[name] = home / name

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUPID_HOME", str(home / "state"))
        make("a", "instant")
        inference = [r for r in records(made["a"]).values() if r.task == "inference"]
        # An instance's three types share their request: a persona is what the instant server can tell apart.
        unmatched = sorted({r.persona_id for r in inference} - {r.persona_id for r in inference if r.scores.recall > 0})
        worst = "|".join(re.escape(f"(case {persona})") for persona in unmatched)
        for name, args in (
            ("fails-all", ("--no-preference-for", ".")),
            ("fails-fifth", ("--no-preference-for", FIFTH)),
            ("fails-worst", ("--no-preference-for", worst)),
            ("worse-some", ("--nonsense-for", SOME)),
        ):
            servers[name] = instant_with(*args)
        make("again", "again")
        make("all", "fails-all")
        make("fifth", "fails-fifth")
        make("worst", "fails-worst")
        make("worse", "worse-some")
        make("oracle", "instant", settings=["oracle"])
        make("inference", "instant", tasks=["inference"])
        make("first80", "instant", limit=240)
        make("decomposer", "instant", decomposer="pm")
    for proc, _ in servers.values():
        proc.terminate()
        proc.wait()
    cut = home / "cut"
    shutil.copytree(made["a"], cut)
    (cut / "instances.jsonl").write_text("")
    made["cut"] = cut
    made["unmatched"] = 3 * len(unmatched)
    return made


def gate(a, b, *options):
    result = CliRunner().invoke(app, ["compare", str(a), str(b), "--fail-if-regression", *options])
    json_result = CliRunner().invoke(app, ["compare", str(a), str(b), "--json", *options])
    return result, json.loads(json_result.output)


def headline_of(comparison, task="inference"):
    return next(r for r in comparison["rows"] if r["headline"] and r["task"] == task)


@pytest.mark.slow  # gate_runs
def test_a_candidate_that_stops_answering_fails_the_gate(gate_runs):
    result, comparison = gate(gate_runs["a"], gate_runs["all"])
    assert result.exit_code == EXIT_REGRESSION, result.output
    assert comparison["no_answer"] == {"b": UNITS} and comparison["matched"] == 2 * UNITS
    assert comparison["left_out"] == {}
    headline = headline_of(comparison)
    assert headline["b"] == 0.0 and headline["difference"] == -headline["a"] < 0  # nothing inferred: F1 0
    assert "REGRESSION: inference/standard/micro_f1" in result.output
    assert f"no answer from the candidate on {UNITS} in B" in result.output
    # Every unit B failed is a loss, in the counts and the list of the largest changes.
    a_f1 = {u.key: u.scores.f1 for u in records(gate_runs["a"]).values() if u.task == "inference"}
    lost = sum(f1 > 0 for f1 in a_f1.values())
    assert comparison["per_unit"]["inference"] == {"better": 0, "worse": lost, "tied": UNITS - lost}
    assert all(u["b"] == 0 and u["change"] < 0 for u in comparison["units"] if u["task"] == "inference")


@pytest.mark.slow  # gate_runs
def test_a_candidate_that_fails_a_fifth_of_its_personas_fails_the_gate(gate_runs):
    b = records(gate_runs["fifth"])
    failed = {u for u, r in b.items() if not r.scored}
    assert len(failed) == 72 and all(b[u].error.stage == "parse_preference" for u in failed)
    assert len({b[u].persona_id for u in failed}) == 24
    result, comparison = gate(gate_runs["a"], gate_runs["fifth"])
    assert result.exit_code == EXIT_REGRESSION, result.output
    assert comparison["no_answer"] == {"b": 72} and comparison["failed"] == {"b_only": 72}
    # The same answers elsewhere: the whole drop is the failed units', each scored as A's items predicted, none matched.
    a = records(gate_runs["a"])
    kept = [a[u].match_counts() for u in a if u not in failed and u[1] == "inference"]
    lost = [a[u].match_counts() for u in failed]
    expected_b = micro(kept + [MatchCounts(0.0, max(c.n_predicted, 1), 0.0, c.n_true) for c in lost]).f1
    headline = headline_of(comparison)
    assert headline["b"] == pytest.approx(expected_b) and comparison["unanswered"]
    # The headline's own test leans the same way (a fifth of the personas each lose their F1 of ~0.14: a mean drop of
    # 3.2 points, under the 5.8 it states it finds 80% of the time: a valid test for any law of changes in [-1, 1]
    # must allow for rare large gains); the unanswered rule is what fails it.
    assert headline["persona_change"] < 0 and headline["e_value"] > 1 and 0 < headline["detectable"]


@pytest.mark.slow  # gate_runs
def test_no_answer_where_the_answer_was_worst_reads_as_a_loss_never_a_gain(gate_runs):
    # B equals A except that it states no preference exactly on the units where A's answer matched nothing.
    assert gate_runs["unmatched"] > 0
    result, comparison = gate(gate_runs["a"], gate_runs["worst"])
    headline = headline_of(comparison)
    assert headline["difference"] <= 0 and headline["b"] <= headline["a"], headline  # counted as predicting nothing,
    # those units would have raised micro precision and F1
    precision = next(r for r in comparison["rows"] if r["metric"] == "micro_precision" and r["instance_type"] is None)
    assert precision["difference"] <= 0
    # Failures beyond the margin (1% of the headline units, rounded down) are a regression of their own.
    allowed = UNITS // 100
    unanswered = f"B left {gate_runs['unmatched']} of {UNITS} headline units unanswered, A 0"
    assert comparison["unanswered"] == [f"inference: {unanswered} (more than the {allowed} more allowed, 1%)"]
    assert comparison["unanswered_allowed"] == {"inference": allowed, "generation": allowed}
    assert result.exit_code == EXIT_REGRESSION and "REGRESSION" in result.output and "unanswered" in result.output, (
        result.output
    )


@pytest.mark.slow  # gate_runs
def test_no_change_passes_the_gate(gate_runs):
    result, comparison = gate(gate_runs["a"], gate_runs["again"])
    assert result.exit_code == 0, result.output
    headline = headline_of(comparison)
    assert (headline["difference"], headline["p_value"], headline["detectable"]) == (0.0, 1.0, None)
    assert "No significant drop in a headline figure" in result.output and "108 personas" in result.output
    assert "inference/standard/micro_f1, generation/standard/mean_score" in " ".join(result.output.split())


@pytest.mark.slow  # gate_runs
def test_a_headline_setting_missing_from_a_run_is_no_verdict(gate_runs):
    """No verdict, exit 3, and why; never another setting instead."""
    result, comparison = gate(gate_runs["oracle"], gate_runs["a"])
    assert result.exit_code == EXIT_NO_VERDICT, result.output
    assert "inference: setting 'standard' is not in run A (A: oracle; B: standard)" in comparison["no_verdict"]
    assert not any(r["headline"] for r in comparison["rows"])
    result, _ = gate(gate_runs["oracle"], gate_runs["oracle"], "--headline-setting", "oracle")
    assert result.exit_code == 0, result.output  # named, it is tested


@pytest.mark.slow  # gate_runs
def test_units_a_judge_failed_on_block_the_verdict_only_beyond_two_percent(gate_runs, tmp_path):
    """A judge that failed on 7 of 324 units: left out and counted; beyond 2% the comparison is incomplete."""
    incomplete = tmp_path / "incomplete"
    shutil.copytree(gate_runs["again"], incomplete)
    lines = (incomplete / "instances.jsonl").read_text().splitlines()
    judged = [json.loads(line) for line in lines]
    inference = [i for i, r in enumerate(judged) if r["task"] == "inference"]
    timeout = {"status": "failed", "error": {"stage": "decompose", "reason": "timeout", "detail": "x"}}
    for i in inference[:35:5]:
        judged[i] = {**judged[i], **timeout}
    (incomplete / "instances.jsonl").write_text("".join(json.dumps(r) + "\n" for r in judged))
    result, comparison = gate(gate_runs["a"], incomplete)
    assert result.exit_code == EXIT_NO_VERDICT, result.output
    assert comparison["left_out"] == {"inference/standard": 7} and comparison["matched"] == 2 * UNITS - 7
    assert "a judge failed on 7 of 324 units (2.2% > 2%)" in comparison["no_verdict"][0]
    judged = [json.loads(line) for line in lines]  # one timeout of 240 is within the threshold
    judged[inference[5]] = {**judged[inference[5]], **timeout}
    (incomplete / "instances.jsonl").write_text("".join(json.dumps(r) + "\n" for r in judged))
    result, comparison = gate(gate_runs["a"], incomplete)
    assert result.exit_code == 0 and comparison["left_out"] == {"inference/standard": 1}, result.output


@pytest.mark.slow  # gate_runs
@pytest.mark.parametrize(
    "b, reason, option",
    [
        ("cut", "run B has no records (cut short before its first unit?): nothing to compare", None),
        ("inference", "not the same evaluation: task generation is in run A only", "--allow-partial"),
        (
            "first80",
            "not the same evaluation: inference/standard: 84 of run A's 324 units are not in run B",
            "--allow-partial",
        ),
        (
            "decomposer",
            "not the same evaluation: differs: judge decomposer: instant -> local-prefmatcher",
            "--allow-differs",
        ),
    ],
)
def test_different_evaluations_have_no_verdict_unless_accepted_by_name(gate_runs, b, reason, option):
    result, comparison = gate(gate_runs["a"], gate_runs[b])
    assert result.exit_code == EXIT_NO_VERDICT, result.output
    assert any(why.startswith(reason) for why in comparison["no_verdict"]), comparison["no_verdict"]
    assert reason in " ".join(result.output.split())
    if option is None:  # nothing to accept: no option gives a verdict on an empty run
        for anything in ("--allow-partial", "--allow-differs"):
            assert gate(gate_runs["a"], gate_runs[b], anything)[0].exit_code == EXIT_NO_VERDICT
        return
    accepted, comparison = gate(gate_runs["a"], gate_runs[b], option)
    assert accepted.exit_code == 0, accepted.output
    assert comparison["no_verdict"] == [] and comparison["accepted"]
    assert all(line.endswith(f"(accepted: {option})") for line in comparison["accepted"])  # as the CLI spells it
    assert "accepted:" in accepted.output and "No significant drop" in accepted.output
    # The library says the same.
    import cupid

    assert cupid.compare(gate_runs["a"], gate_runs[b]).exit_code == EXIT_NO_VERDICT
    keyword = option[2:].replace("-", "_")
    assert cupid.compare(gate_runs["a"], gate_runs[b], **{keyword: True}).exit_code == 0


@pytest.mark.slow  # gate_runs
def test_a_margin_passes_a_drop_smaller_than_itself_that_fails_without_it(gate_runs):
    result, comparison = gate(gate_runs["a"], gate_runs["worse"])
    headline = headline_of(comparison)
    drop = -100 * headline["difference"]  # F1 points
    assert drop > 0 and result.exit_code == EXIT_REGRESSION, (
        result.output
    )  # answered (no failure), only worse: a significant drop
    assert comparison["no_answer"] == {} and comparison["unanswered"] == []
    result, comparison = gate(gate_runs["a"], gate_runs["worse"], "--margin", f"{2 * drop:.2f}")
    assert result.exit_code == 0, result.output
    headline = headline_of(comparison)
    assert headline["null"] == pytest.approx(-2 * drop / 100, abs=1e-4)
    said = " ".join(result.output.split())
    margin = f"{2 * drop:.2f}".rstrip("0").rstrip(".")
    assert f"a drop beyond the margin {margin} F1 points (inference), judge-score points (generation)" in said
    assert comparison["margin_units"] == {"inference": "F1 points", "generation": "judge-score points"}
    # What would go unseen counts the margin: a drop is flagged only beyond it.
    unseen = 100 * headline["detectable"] + float(f"{2 * drop:.2f}")
    assert f"inference/standard/micro_f1 {unseen:.1f}" in said.split("would likely go unseen")[0].split("about")[-1]
    # The units B may leave unanswered beyond A, for this comparison.
    assert f"unanswered than A: inference {UNITS // 100}; generation {UNITS // 100}" in said
    assert "did you mean a fraction" not in said
    # A margin below the drop's interval still fails it.
    assert gate(gate_runs["a"], gate_runs["worse"], "--margin", f"{drop / 10:.2f}")[0].exit_code == EXIT_REGRESSION


def test_the_unanswered_allowance_is_one_percent_rounded_down():
    from cupid.eval.results.compare import more_unanswered, unanswered_allowed

    # A full run's 756 headline units: 7 more unanswered pass, the 8th fails (1%, rounded down); 252: 2 pass, not 3.
    for units, allowed in ((756, 7), (252, 2), (99, 0)):
        assert unanswered_allowed(units) == allowed
        assert more_unanswered("inference", [(True, False)] * allowed + [(True, True)] * (units - allowed)) == []
        assert more_unanswered("inference", [(True, False)] * (allowed + 1) + [(True, True)] * (units - allowed - 1))


@pytest.mark.slow  # gate_runs
def test_a_margin_under_a_tenth_of_a_point_asks_whether_a_fraction_was_meant(gate_runs):
    """On the line before the verdict."""
    from cupid.eval.results.compare import margin_question

    assert margin_question(0.5) is None and margin_question(0) is None
    result, _ = gate(gate_runs["a"], gate_runs["again"], "--margin", "0.02")
    said = " ".join(result.output.split())
    assert "did you mean a fraction? the margin 0.02 is in points" in said and "for 2 points give 2" in said
