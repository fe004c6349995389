"""`cupid compare` on real runs: the random-weight model's answers (held to the task's format, so they parse) against
the instant server's, scored by the same judges, then a run whose decomposer changed."""

import json
import shutil

import pytest
from typer.testing import CliRunner

from cupid.cli import app
from cupid.eval.benchmark.records import UnitRecord
from cupid.eval.benchmark.runner import RunConfig, run
from cupid.eval.benchmark.tasks import INFERENCE
from cupid.matcher.scores import MatchCounts, macro, micro
from tests.conftest import write_endpoints


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
        return {f"{agg}_{name}": getattr(points[agg], name) for agg in points for name in ("precision", "recall", "f1")}

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


def test_a_changed_judge_is_named_and_the_same_answers_differ_by_nothing(runs):
    comparison = json.loads(CliRunner().invoke(app, ["compare", str(runs["b"]), str(runs["c"]), "--json"]).output)
    assert comparison["differs"] == ["judge decomposer: instant -> local-prefmatcher"]
    same = json.loads(CliRunner().invoke(app, ["compare", str(runs["b"]), str(runs["b"]), "--json"]).output)
    assert all((r["difference"], r["low"], r["high"], r["p_value"]) == (0.0, None, None, None) for r in same["rows"])
    # The sample's 4 personas are too few to test: no verdict, which a gate does not pass.
    gated = CliRunner().invoke(app, ["compare", str(runs["b"]), str(runs["b"]), "--fail-if-regression"])
    assert gated.exit_code == 3, gated.output
    assert "NO VERDICT: inference/standard: 4 personas compared, fewer than 10" in " ".join(gated.output.split())
    missing = CliRunner().invoke(app, ["compare", str(runs["b"]), str(runs["b"] / "nowhere")])
    assert missing.exit_code == 1 and "nowhere: no such run directory" in missing.output


# ---------------------------------------------------------------- the gate, on a candidate that fails

COPIES = 15  # the sample's 4 personas 15 times: 60 personas, 180 inference units in the standard setting
FIFTH = r"\(case sample-\d+-(0|5|10)\)"  # 3 copies of 4 personas: 12 of 60


@pytest.fixture(scope="module")
def gate_runs(tmp_path_factory, instant_url):
    """Runs of one candidate (the instant server) on 60 personas: A; A again under another name (the same answers);
    B that states no preference at all; B that states none for a fifth of the personas (the rest A's answers);
    and A in the oracle setting only."""
    from cupid.serving.instant import start as start_instant
    from tests.conftest import sample_copies

    home = tmp_path_factory.mktemp("gate")
    broken = {name: start_instant("--no-preference-for", regex) for name, regex in (("all", "."), ("fifth", FIFTH))}
    endpoints = write_endpoints(
        home / "endpoints.yaml",
        instant={"base_url": instant_url, "model": "instant"},
        again={"base_url": instant_url, "model": "instant-again"},
        pm={"base_url": instant_url, "model": "local-prefmatcher"},
        **{f"fails-{name}": {"base_url": url, "model": f"fails-{name}"} for name, (_, url) in broken.items()},
    )
    common = {
        "endpoints": str(endpoints),
        "data": str(sample_copies(home / "personas.jsonl", COPIES, marked=True)),
        "decomposer": "instant",
        "matcher": "pm",
        "tasks": ["inference"],
        "cache": str(home / "cache.sqlite"),
    }
    made = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUPID_HOME", str(home / "state"))
        for name, candidate, settings in (
            ("a", "instant", ["standard"]),
            ("again", "again", ["standard"]),
            ("all", "fails-all", ["standard"]),
            ("fifth", "fails-fifth", ["standard"]),
            ("oracle", "instant", ["oracle"]),
        ):
            run(RunConfig(**common, candidate=candidate, settings=settings, out=str(home / name)))
            made[name] = home / name
    for proc, _ in broken.values():
        proc.terminate()
        proc.wait()
    return made


def gate(a, b, *options):
    result = CliRunner().invoke(app, ["compare", str(a), str(b), "--fail-if-regression", *options])
    json_result = CliRunner().invoke(app, ["compare", str(a), str(b), "--json"])
    return result, json.loads(json_result.output)


def test_a_candidate_that_stops_answering_fails_the_gate(gate_runs):
    result, comparison = gate(gate_runs["a"], gate_runs["all"])
    assert result.exit_code == 2, result.output
    assert comparison["no_answer"] == {"b": 180} and comparison["matched"] == 180 and comparison["left_out"] == {}
    headline = next(r for r in comparison["rows"] if r["headline"])
    assert headline["b"] == 0.0 and headline["difference"] == -headline["a"] < 0  # nothing inferred: F1 0
    assert "REGRESSION: inference/standard/micro_f1" in result.output
    assert "no answer from the candidate on 180 in B" in result.output
    # Every unit B failed is a loss, in the counts and the list of the largest changes.
    a_f1 = {u.key: u.scores.f1 for u in records(gate_runs["a"]).values()}
    lost = sum(f1 > 0 for f1 in a_f1.values())
    assert comparison["per_unit"]["inference"] == {"better": 0, "worse": lost, "tied": 180 - lost}
    assert comparison["units"] and all(u["b"] == 0 and u["change"] < 0 for u in comparison["units"])


def test_a_candidate_that_fails_a_fifth_of_its_personas_fails_the_gate(gate_runs):
    b = records(gate_runs["fifth"])
    failed = {u for u, r in b.items() if not r.scored}
    assert len(failed) == 36 and all(b[u].error.stage == "parse_preference" for u in failed)
    assert len({b[u].persona_id for u in failed}) == 12
    result, comparison = gate(gate_runs["a"], gate_runs["fifth"])
    assert result.exit_code == 2, result.output
    assert comparison["no_answer"] == {"b": 36} and comparison["failed"] == {"b_only": 36}
    # The same answers elsewhere: the whole drop is the failed units', scored as nothing inferred.
    a = records(gate_runs["a"])
    kept = [a[u].match_counts() for u in a if u not in failed]
    lost = [a[u].match_counts() for u in failed]
    expected_b = micro(kept + [type(c)(0.0, 0, 0.0, c.n_true) for c in lost]).f1
    headline = next(r for r in comparison["rows"] if r["headline"])
    assert headline["b"] == pytest.approx(expected_b) and headline["p_holm"] < 0.05
    assert headline["detectable"] is not None and headline["detectable"] > 0


def test_no_change_passes_and_no_verdict_is_not_a_pass(gate_runs, tmp_path):
    result, comparison = gate(gate_runs["a"], gate_runs["again"])
    assert result.exit_code == 0, result.output
    headline = next(r for r in comparison["rows"] if r["headline"])
    assert (headline["difference"], headline["p_value"], headline["detectable"]) == (0.0, 1.0, None)
    assert "No significant drop in a headline figure" in result.output and "60 personas" in result.output

    # The headline setting is in neither pair of runs: no verdict, exit 3, and why; never another setting instead.
    result, comparison = gate(gate_runs["oracle"], gate_runs["a"])
    assert result.exit_code == 3, result.output
    assert comparison["no_verdict"] == ["inference: setting 'standard' is not in run A (A: oracle; B: standard)"]
    assert not any(r["headline"] for r in comparison["rows"])
    result, _ = gate(gate_runs["oracle"], gate_runs["oracle"], "--headline-setting", "oracle")
    assert result.exit_code == 0, result.output  # named, it is tested

    # A judge that failed on 5 of 180 units: left out and counted; beyond 2% the comparison is incomplete.
    incomplete = tmp_path / "incomplete"
    shutil.copytree(gate_runs["again"], incomplete)
    lines = (incomplete / "instances.jsonl").read_text().splitlines()
    judged = [json.loads(line) for line in lines]
    for i in range(0, 25, 5):
        judged[i] = {
            **judged[i],
            "status": "failed",
            "error": {"stage": "decompose", "reason": "timeout", "detail": "x"},
        }
    (incomplete / "instances.jsonl").write_text("".join(json.dumps(r) + "\n" for r in judged))
    result, comparison = gate(gate_runs["a"], incomplete)
    assert result.exit_code == 3, result.output
    assert comparison["left_out"] == {"inference/standard": 5} and comparison["matched"] == 175
    assert "a judge failed on 5 of 180 units (2.8% > 2%)" in comparison["no_verdict"][0]
    judged[0] = json.loads(lines[0])  # one timeout of 180 is within the threshold
    for i in range(5, 25, 5):
        judged[i] = json.loads(lines[i])
    judged[5] = {**judged[5], "status": "failed", "error": {"stage": "decompose", "reason": "timeout", "detail": "x"}}
    (incomplete / "instances.jsonl").write_text("".join(json.dumps(r) + "\n" for r in judged))
    result, comparison = gate(gate_runs["a"], incomplete)
    assert result.exit_code == 0 and comparison["left_out"] == {"inference/standard": 1}, result.output
