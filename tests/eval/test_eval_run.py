"""The inference task end to end over real HTTP: the instant server for exact scoring, the real tiny model for real
answers."""

import json
import subprocess

import pytest

from cupid.common.config import ConfigError
from cupid.eval.benchmark.inference import INFERENCE
from cupid.eval.benchmark.records import UnitRecord
from cupid.eval.benchmark.runner import RunConfig, dry_run, run
from cupid.eval.benchmark.summary import Requests
from cupid.matcher.scores import MatchCounts, macro, micro
from tests.helpers import REPO, write_endpoints


def config(endpoints, tmp_path, **kw) -> RunConfig:
    values = {
        "endpoints": str(endpoints),
        "candidate": "instant",
        "decomposer": "instant",
        "matcher": "pm",
        "out": str(tmp_path / "run"),
        "cache": str(tmp_path / "cache.sqlite"),
    }
    values.update(kw)
    return RunConfig(**values)


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "instances.jsonl").read_text().splitlines()]


def test_full_sample_is_scored_and_summarized(endpoints, tmp_path, cupid_home):
    summary = run(config(endpoints, tmp_path, settings=["standard", "oracle"])).summary
    assert (summary.n_instances, summary.n_runs, summary.n_scored, summary.n_failed) == (12, 24, 24, 0)
    rows = records(tmp_path / "run")
    assert len(rows) == 24
    row = rows[0]
    assert row["inferred_preference"].startswith("Updates should be brief")
    assert [m["entry"] for m in row["infer_to_gt"]] == row["inferred_checklist"]
    assert [m["entry"] for m in row["gt_to_infer"]] == row["gt_checklist"]
    standard = [r for r in rows if r["setting"] == "standard"]
    counts = [MatchCounts(**r["counts"]) for r in standard]
    inference = summary.tasks["inference"]
    assert inference.setting == "standard" and inference.overall.micro == micro(counts)
    assert inference.overall.macro == macro(counts)
    assert inference.overall.micro.f1 != pytest.approx(inference.overall.macro.f1)
    assert inference.settings["standard"].by_type["changing"].n_scored == 4
    oracle = INFERENCE.figures([UnitRecord.model_validate(r) for r in rows if r["setting"] == "oracle"])
    assert inference.settings["oracle"].overall == oracle
    assert summary.roles["matcher"] == "pm (local-prefmatcher)" and summary.matcher_prompt == "prefmatcher"
    md = (tmp_path / "run" / "summary.md").read_text()
    assert "| instances | standard P | standard R | standard F1 | standard n | oracle P |" in md
    assert md.count("| changing |") == 2  # micro and macro tables


def test_resume_reruns_only_what_is_missing_and_pays_nothing_twice(endpoints, tmp_path, cupid_home):
    cfg = config(endpoints, tmp_path)
    first = run(cfg).summary
    assert first.requests is not None and first.requests.sent > 0
    path = tmp_path / "run" / "instances.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:5]) + '\n{"key": "torn')  # a crash mid-write
    again = run(cfg).summary
    assert again.n_scored == 12 and again.requests is not None
    assert again.requests.sent == 0  # every answer came from the cache
    assert 0 < again.requests.cached < first.requests.sent  # only the 7 missing instances asked
    assert again.tasks == first.tasks
    third = run(cfg).summary
    assert third.requests == Requests(sent=0, cached=0)


def test_real_tiny_candidate_failures_are_recorded_counted_and_kept_out(endpoints, tiny_server, tmp_path, cupid_home):
    cfg = config(endpoints, tmp_path, candidate="tiny", limit=2)
    summary = run(cfg).summary
    rows = records(tmp_path / "run")
    assert len(rows) == 2
    # `tiny` is the random-weight model with no structured output: its free answers are noise, which cannot
    # spell the '### Most Likely Preference' header and a line after it, so both units fail at parsing.
    assert [r["status"] for r in rows] == ["failed", "failed"]
    for row in rows:
        assert row["error"]["stage"] == "parse_preference" and row["error"]["reason"] == "parse_error"
        assert row["error"]["raw"] == row["candidate_answer"] and row["candidate_answer"]
        assert "inferred_preference" not in row and "counts" not in row  # nothing went on to the judges
    assert (summary.n_failed, summary.n_scored) == (2, 0)
    assert summary.failures == {"inference/parse_preference: parse_error": 2}
    overall = summary.tasks["inference"].overall
    assert (overall.n_scored, overall.n_failed, overall.failed_by_stage) == (0, 2, {"parse_preference": 2})
    assert overall.micro is None and overall.macro is None  # kept out: no figure, not a zero
    rerun = run(cfg).summary  # both failed instances run again, and their answers come from the cache
    assert rerun.requests == Requests(sent=0, cached=2)
    assert (rerun.n_failed, rerun.failures) == (2, summary.failures)


def test_real_tiny_matcher_failure_names_the_stage(endpoints, tiny_server, tmp_path, cupid_home):
    summary = run(config(endpoints, tmp_path, matcher="tinymatch", limit=1)).summary
    (row,) = records(tmp_path / "run")
    # `tinymatch` is the random-weight model with no structured output: noise cannot be a JSON list labelling each
    # item, so both directions fail to parse, and the first direction read (infer_to_gt) names the stage.
    assert row["status"] == "failed"
    assert row["error"]["stage"] == "match_infer_to_gt" and row["error"]["reason"] == "parse_error"
    assert row["error"]["raw"] == row["matcher_answers"]["infer_to_gt"]
    assert set(row["matcher_answers"]) == {"infer_to_gt", "gt_to_infer"}  # both answers kept for the resume
    assert row["inferred_checklist"] and "counts" not in row  # the stages before it kept, nothing counted
    assert summary.failures == {"inference/match_infer_to_gt: parse_error": 1}
    assert summary.tasks["inference"].overall.micro is None


def test_a_run_with_failures_exits_1_with_its_count_last_unless_allowed(endpoints, tiny_server, tmp_path, cupid_home):
    args = [str(REPO / ".venv" / "bin" / "cupid"), "eval", "run", "--endpoints", str(endpoints),
            "--candidate", "instant", "--decomposer", "instant", "--matcher", "tinymatch", "--limit", "1",
            "--out", str(tmp_path / "cli"), "--cache", str(tmp_path / "cache.sqlite")]  # fmt: skip
    strict = subprocess.run(args, check=False, capture_output=True, text=True, cwd=REPO)
    summary = json.loads((tmp_path / "cli" / "summary.json").read_text())
    last = strict.stdout.strip().splitlines()[-1]
    # the random-weight matcher's free answers cannot parse (see the test above): the one unit fails
    assert (summary["n_failed"], summary["n_scored"]) == (1, 0)
    assert last.startswith("1 failed, 0 invalid rows, 0 scored of 1")
    assert strict.returncode == 1
    lenient = subprocess.run(args + ["--allow-failures"], check=False, capture_output=True, text=True, cwd=REPO)
    assert lenient.returncode == 0


def test_dry_run_writes_batch_requests_and_sends_nothing(tmp_path, cupid_home):
    endpoints = write_endpoints(
        tmp_path / "ep.yaml", off={"base_url": "http://127.0.0.1:9/v1", "model": "cand", "max_tokens": 99}
    )
    out = tmp_path / "batch.jsonl"
    n = dry_run(config(endpoints, tmp_path, candidate="off", decomposer="off", matcher="off", settings=["oracle"]), out)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert n == len(lines) == 12
    assert lines[0]["url"] == "/v1/chat/completions" and lines[0]["method"] == "POST"
    assert lines[0]["body"]["model"] == "cand" and lines[0]["body"]["max_tokens"] == 99
    assert lines[0]["custom_id"].endswith("/oracle/inference")
    assert not (tmp_path / "run").exists()


def test_refusals_before_sending(endpoints, tiny_server, tmp_path, cupid_home, monkeypatch):
    monkeypatch.delenv("CUPID_TEST_MISSING_KEY", raising=False)
    with pytest.raises(ConfigError, match="CUPID_TEST_MISSING_KEY"):
        run(config(endpoints, tmp_path, matcher="paid"))
    assert not (tmp_path / "run").exists()
    run(config(endpoints, tmp_path, limit=1))
    with pytest.raises(ConfigError, match="holds another run"):
        run(config(endpoints, tmp_path, candidate="tiny", limit=1))
    with pytest.raises(ConfigError, match="no endpoint named 'nobody'"):
        run(config(endpoints, tmp_path, candidate="nobody"))


def test_a_candidates_failures_are_recorded_counted_and_kept_out_of_the_figures(tmp_path, instant_url, cupid_home):
    """Deterministic: the instant server as a candidate that states no preference for one persona (its three
    instances) and answers the other's: three units failed at parse_preference with their raw answers, three scored,
    and the run's figures are the scored three's."""
    from cupid.serving.servers.instant import start as start_instant
    from tests.helpers import sample_copies

    proc, url = start_instant("--no-preference-for", r"\(case sample-01-0\)")
    try:
        endpoints = write_endpoints(
            tmp_path / "ep.yaml",
            instant={"base_url": instant_url, "model": "instant"},
            pm={"base_url": instant_url, "model": "local-prefmatcher"},
            silent={"base_url": url, "model": "silent-for-one"},
        )
        data = sample_copies(tmp_path / "marked.jsonl", 1, marked=True)
        summary = run(config(endpoints, tmp_path, candidate="silent", data=str(data), limit=6)).summary
    finally:
        proc.terminate()
        proc.wait()
    rows = records(tmp_path / "run")
    failed = [r for r in rows if r["status"] == "failed"]
    scored = [r for r in rows if r["status"] == "scored"]
    assert [r["persona_id"] for r in failed] == ["sample-01-0"] * 3 and len(scored) == 3
    assert all(r["error"]["stage"] == "parse_preference" and r["error"]["raw"] == r["candidate_answer"] for r in failed)
    assert (summary.n_failed, summary.n_scored) == (3, 3)
    assert summary.failures == {"inference/parse_preference: parse_error": 3}
    overall = summary.tasks["inference"].overall
    assert overall.n_scored == 3 and overall.n_failed == 3
    kept = [UnitRecord.model_validate(r).match_counts() for r in scored]
    assert overall.micro.f1 == pytest.approx(micro(kept).f1)  # the failed three are left out, not zeros
