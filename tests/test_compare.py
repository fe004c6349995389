"""`cupid compare` on real runs: the random-weight model's answers (held to the task's format, so they parse) against
the instant server's, scored by the same judges, then a run whose decomposer changed."""

import json

import pytest
from typer.testing import CliRunner

from cupid.cli import app
from cupid.eval.records import UnitRecord
from cupid.eval.runner import RunConfig, run
from cupid.eval.tasks import INFERENCE
from cupid.matcher.scores import macro, micro
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
    matched = [u for u in a if u in b and a[u].scored and b[u].scored]
    assert comparison["matched"] == len(matched) > 0 and comparison["only_a"] == comparison["only_b"] == 0
    assert comparison["matched"] + sum(comparison["failed"].values()) == len(a)
    assert comparison["differs"] == [] and comparison["personas"] == len({a[u].persona_id for u in matched})

    def figures(side, setting, group):
        counts = [side[u].match_counts() for u in matched if u[2] == setting and group in (None, side[u].instance_type)]
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
        assert row["p_value"] <= row["p_holm"] <= 1
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
    same = json.loads(
        CliRunner().invoke(app, ["compare", str(runs["b"]), str(runs["b"]), "--json", "--fail-if-regression"]).output
    )
    assert all((r["difference"], r["low"], r["high"], r["p_value"]) == (0.0, 0.0, 0.0, 1.0) for r in same["rows"])
    missing = CliRunner().invoke(app, ["compare", str(runs["b"]), str(runs["b"] / "nowhere")])
    assert missing.exit_code == 1 and "nowhere: no such run directory" in missing.output
