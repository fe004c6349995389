"""Both tasks in every setting over real HTTP: the real tiny model as candidate, the instant server
where exact, parseable answers are needed (judge, decomposer, matcher, summarizer)."""

import json
import sqlite3

import pytest

from cupid.common.config import ConfigError
from cupid.eval.benchmark import data as cupid_data
from cupid.eval.benchmark.history import relevant_sessions
from cupid.eval.benchmark.runner import RunConfig, dry_run, run
from cupid.matcher import prompts
from cupid.serving.servers.instant import start as start_instant
from tests.helpers import TINY_NAME, write_endpoints

SETTINGS = ["standard", "oracle", "oracle-preference", "summary"]


def config(endpoints, tmp_path, **kw) -> RunConfig:
    values = {
        "endpoints": str(endpoints),
        "candidate": "instant",
        "decomposer": "instant",
        "matcher": "pm",
        "judge": "instant",
        "summarizer": "instant",
        "tasks": ["inference", "generation"],
        "out": str(tmp_path / "run"),
        "cache": str(tmp_path / "cache.sqlite"),
    }
    values.update(kw)
    return RunConfig(**values)


def records(tmp_path):
    return [json.loads(line) for line in (tmp_path / "run" / "instances.jsonl").read_text().splitlines()]


def sent(cache_file, prompt_name):
    """Requests in the cache whose system text is the named prompt's."""
    system = prompts.load(prompt_name).system
    with sqlite3.connect(cache_file) as db:
        rows = [json.loads(r[0]) for r in db.execute("SELECT request FROM responses")]
    return [r for r in rows if r["messages"][0]["content"] == system]


def test_every_task_and_setting_with_the_real_tiny_candidate(endpoints, tiny_server, tmp_path, cupid_home):
    summary = run(config(endpoints, tmp_path, candidate="tiny", settings=SETTINGS, limit=1)).summary
    rows = {(r["task"], r["setting"]): r for r in records(tmp_path)}
    # oracle-preference is a generation setting only
    assert set(rows) == {("inference", s) for s in ("standard", "oracle", "summary")} | {
        ("generation", s) for s in SETTINGS
    }
    instance = cupid_data.load("sample").instances[0]
    for (task, setting), row in rows.items():
        assert row["key"] == instance.key and row["relevant_sessions"] == relevant_sessions(instance)
        assert row["candidate_answer"], (task, setting)  # the tiny model answered every prompt
        if task == "generation":  # the judge's answer always parses: every generation unit is scored
            assert row["status"] == "scored" and 1 <= row["score"] <= 10
            assert "### Evaluation Score" in row["judge_answer"]
        else:  # `tiny` is the random-weight model, unconstrained: noise cannot hold the preference header
            assert row["status"] == "failed" and row["error"]["reason"] == "parse_error"
            assert row["error"]["stage"] == "parse_preference" and row["error"]["raw"] == row["candidate_answer"]
    assert (
        rows[("inference", "oracle")]["n_sessions"]
        == len(relevant_sessions(instance))
        < rows[("inference", "standard")]["n_sessions"]
    )
    assert rows[("generation", "oracle-preference")]["n_sessions"] == 0
    assert set(summary.tasks["generation"].settings) == set(SETTINGS)
    assert set(summary.tasks["inference"].settings) == {"standard", "oracle", "summary"}
    standard = summary.tasks["generation"].settings["standard"]
    assert standard.overall.mean_score == rows[("generation", "standard")]["score"]
    assert standard.by_type[instance.instance_type].n_scored == 1
    assert (summary.n_runs, summary.n_scored, summary.n_failed) == (7, 4, 3)  # the 4 generation units scored
    assert summary.failures == {"inference/parse_preference: parse_error": 3}


def test_candidate_prompts_per_setting_and_summaries_cached_per_session(endpoints, tmp_path, cupid_home):
    cache_file = tmp_path / "cache.sqlite"
    summary = run(config(endpoints, tmp_path, settings=SETTINGS)).summary
    assert summary.n_failed == 0 and summary.n_runs == 12 * 3 + 12 * 4
    sample = cupid_data.load("sample").instances
    distinct_sessions = {json.dumps(s.model_dump(), sort_keys=True) for i in sample for s in i.prior_interactions}
    assert len(sent(cache_file, "summarizer")) == len(distinct_sessions)  # one call per session, whatever shares it
    by_setting = {}
    for request in sent(cache_file, "generation") + sent(cache_file, prompts.ORACLE_PREFERENCE):
        user = request["messages"][1]["content"]
        by_setting.setdefault(
            "summary"
            if "#### Preferences" in user
            else "oracle-preference"
            if "## User's Preference" in user
            else "log",
            [],
        ).append(user)
    # identical requests are sent (and cached) once
    assert len(by_setting["oracle-preference"]) == len(
        {(i.current_contextual_preference, i.current_request) for i in sample}
    )
    assert len(by_setting["summary"]) == len(
        {(json.dumps(i.model_dump()["prior_interactions"]), i.current_request) for i in sample}
    )
    assert all("#### User" not in u for u in by_setting["summary"] + by_setting["oracle-preference"])
    gt = {i.current_contextual_preference for i in sample}
    assert {u.split("## User's Preference\n\n")[1].split("\n\n---")[0] for u in by_setting["oracle-preference"]} == gt
    scores = summary.tasks["generation"].settings
    # the instant candidate repeats the preference it is given: the judge sees the ground truth adhered to
    assert scores["oracle-preference"].overall.mean_score > scores["standard"].overall.mean_score
    md = (tmp_path / "run" / "summary.md").read_text()
    assert "| instances | standard score | standard n | oracle score | oracle n | oracle-preference score |" in md


def test_reference_rescoring_side_by_side_without_asking_the_candidate_again(
    endpoints, tmp_path, cupid_home, monkeypatch
):
    monkeypatch.delenv("CUPID_TEST_MISSING_KEY", raising=False)
    with pytest.raises(ConfigError, match="CUPID_TEST_MISSING_KEY"):
        run(config(endpoints, tmp_path, reference="paid"))
    assert not (tmp_path / "run").exists()  # stopped before sending anything

    monkeypatch.setenv("CUPID_TEST_MISSING_KEY", "sk-test")
    summary = run(config(endpoints, tmp_path, reference="paid", limit=3)).summary
    rows = records(tmp_path)
    assert all(r["reference"]["status"] == "scored" for r in rows)
    inference = [r for r in rows if r["task"] == "inference"]
    # same answer, other matcher dialect (fewshot for the reference), same labels from the instant server
    assert all(r["reference"]["inferred_preference"] == r["inferred_preference"] for r in inference)
    assert summary.reference is not None
    assert summary.reference["inference"].overall.micro == summary.tasks["inference"].overall.micro
    assert summary.reference["generation"].overall.mean_score == summary.tasks["generation"].overall.mean_score
    assert len(sent(tmp_path / "cache.sqlite", "inference")) == len(inference)  # the candidate was asked once per unit
    assert summary.roles["reference"] == "paid (paid-4o)"
    assert "Reference (paid (paid-4o)) inference" in (tmp_path / "run" / "summary.md").read_text()


def test_a_small_context_window_is_counted_not_crashed(tmp_path, cupid_home):
    proc, url = start_instant("--context-window", "1500")
    try:
        endpoints = write_endpoints(
            tmp_path / "ep.yaml",
            small={"base_url": url, "model": "small", "max_tokens": 100, "matcher_prompt": "prefmatcher"},
        )
        summary = run(
            config(
                endpoints,
                tmp_path,
                candidate="small",
                decomposer="small",
                matcher="small",
                judge="small",
                summarizer=None,
                settings=["standard", "oracle"],
            )
        ).summary
    finally:
        proc.terminate()
        proc.wait()
    rows = records(tmp_path)
    too_long = [r for r in rows if r["status"] == "failed"]
    assert too_long and all(r["error"]["reason"] == "context_length_exceeded" for r in too_long)
    assert {r["error"]["stage"] for r in too_long} <= {"infer", "generate"}
    assert summary.failures["inference/infer: context_length_exceeded"] == sum(
        r["task"] == "inference" for r in too_long
    )
    assert summary.tasks["inference"].overall.failed_by_stage.get("infer", 0) == sum(
        r["task"] == "inference" and r["setting"] == "standard" for r in too_long
    )
    assert any(r["status"] == "scored" and r["setting"] == "oracle" for r in rows)  # fewer sessions fit


def test_run_config_names_the_missing_role():
    with pytest.raises(ValueError, match="judge"):
        RunConfig(candidate="c", tasks=["generation"])
    with pytest.raises(ValueError, match="summarizer"):
        RunConfig(candidate="c", judge="j", tasks=["generation"], settings=["summary"])
    with pytest.raises(ValueError, match=r"no task runs in these settings \(inference in standard, oracle, summary\)"):
        RunConfig(candidate="c", decomposer="d", matcher="m", settings=["oracle-preference"])


def test_offline_executor_without_vllm_is_refused_clearly(endpoints, tmp_path, cupid_home):
    with pytest.raises(ConfigError, match="vllm"):
        run(config(endpoints, tmp_path, executor="vllm-offline", limit=1))
    assert not (tmp_path / "run").exists()


def test_a_running_server_is_an_endpoint_by_its_name(endpoints, tmp_path, tiny_server, session_home, monkeypatch):
    monkeypatch.setenv("CUPID_HOME", str(session_home))  # where the session's tiny server is recorded
    out = tmp_path / "batch.jsonl"
    dry_run(config(endpoints, tmp_path, candidate=TINY_NAME, tasks=["generation"], limit=2), out)
    bodies = [json.loads(line)["body"] for line in out.read_text().splitlines()]
    assert [b["model"] for b in bodies] == [TINY_NAME, TINY_NAME]
    with pytest.raises(ConfigError, match="no endpoint named 'nobody'"):
        dry_run(config(endpoints, tmp_path, candidate="nobody", tasks=["generation"]), out)
