"""CUPID inside inspect-ai: the real `inspect eval cupid/inference cupid/generation` (found through the entry
point), the candidate (the instant server: the same answers however requests are batched) through inspect's
OpenAI-compatible provider, the judges as a base URL and as endpoint names (the instant server's labels, the random
model under vLLM as a judge without its format); logs read with inspect's own reader, and compared with `cupid eval
run` on the same candidate sharing the same request cache."""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cupid.common.config import ConfigError
from cupid.eval.benchmark.data import SAMPLE_PATH, load
from cupid.eval.benchmark.inference import INFERENCE
from cupid.eval.benchmark.records import UnitRecord
from cupid.eval.benchmark.rundir import RunDir
from cupid.eval.benchmark.runner import RunConfig, build_tasks
from cupid.eval.benchmark.stats import MIN_PERSONAS
from cupid.eval.integrations import inspect_tasks
from cupid.serving.client import Client
from cupid.serving.registry import load_endpoints
from tests.helpers import write_endpoints

if TYPE_CHECKING:
    from inspect_ai.log import EvalLog  # imported where read: inspect_ai takes ~1 s to import

BIN = Path(sys.executable).parent
RUN_ONLY = ("roles", "requests", "wall_s", "inspect_logs")  # what says how a run was made, not what it found


def inspect_eval(*args: str, cwd: Path, base_url: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "TINY_BASE_URL": base_url,
        "TINY_API_KEY": "EMPTY",
    }  # inspect's openai-api/<service>/ variables
    cmd = [str(BIN / "inspect"), "eval", *args, "--model", "openai-api/tiny/tiny-random-llama", "--display", "none"]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=cwd, env=env)


def cupid(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "cupid"), *args], check=False, capture_output=True, text=True, cwd=cwd)


def logs(directory: Path) -> dict[str, EvalLog]:
    from inspect_ai.log import read_eval_log

    found = [read_eval_log(str(p)) for p in sorted(directory.glob("*.eval"))]
    return {log.eval.task: log for log in found}


@pytest.fixture(scope="module")
def both_ways(tmp_path_factory, tiny_server, instant_url, session_home):
    """inspect's eval of both tasks (3 sample instances, oracle setting), then `cupid eval run` of the same
    candidate and judges on the same cache, then the logs imported as a run directory."""
    tmp = tmp_path_factory.mktemp("inspect")
    endpoints = write_endpoints(
        tmp / "ep.yaml",
        # The candidate is the instant server, under inspect and under the CLI alike: its answers are the same
        # however the requests are batched (the random model's greedy answers are not, on a loaded CPU: the CLI run
        # then asked its judges other questions than inspect had, and the two runs differed).
        cand={
            "base_url": instant_url,
            "model": "tiny-random-llama",
            "structured_output": True,
            "constrain_candidate": True,
            "max_tokens": tiny_server["max_tokens"],
        },
        # The judges that label are the instant server's (a checklist to match, labels by word overlap): the random
        # model held to the decomposer's format writes an empty checklist, which ends a unit before its matcher
        # requests.
        judges={
            "base_url": instant_url,
            "model": "instant",
            "structured_output": True,
        },  # what the base URL below makes
        decomposer={"base_url": instant_url, "model": "instant"},  # by name
        freejudge=tiny_server,  # a judge without its format (random weights): failed stages, counted as such
    )
    cache = tmp / "cache.sqlite"
    args = ["-T", "setting=oracle", "-T", "limit=3", "-T", "constrain=true",
            "-T", f"max_tokens={tiny_server['max_tokens']}",
            "-T", "decomposer=decomposer", "-T", f"matcher={instant_url}", "-T", "structured_output=true",
            "-T", "judge=freejudge", "-T", f"endpoints={endpoints}", "-T", f"cache={cache}",
            "--log-dir", str(tmp / "logs")]  # fmt: skip
    inspected = inspect_eval("cupid/inference", "cupid/generation", *args, cwd=tmp, base_url=instant_url)
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr
    ran = cupid("eval", "run", "--endpoints", str(endpoints), "--candidate", "cand", "--decomposer", "decomposer",
                "--matcher", "judges", "--judge", "freejudge", "--task", "both", "--setting", "oracle", "--limit", "3",
                "--out", str(tmp / "run"), "--cache", str(cache), cwd=tmp)  # fmt: skip
    assert ran.returncode == 1 and "failed at generation/judge" in ran.stdout, ran.stderr  # exit 1: some units failed
    imported = cupid(
        "import-inspect", *map(str, sorted((tmp / "logs").glob("*.eval"))), "--out", str(tmp / "imported"), cwd=tmp
    )
    assert imported.returncode == 0, imported.stderr
    return tmp


def test_inspect_finds_the_tasks_and_scores_each_sample_as_cupid_eval_run_does(both_ways):
    found = logs(both_ways / "logs")
    assert set(found) == {"cupid/inference", "cupid/generation"} and all(
        log.status == "success" for log in found.values()
    )
    cli = {(r.key, r.task): r for r in RunDir(both_ways / "run").read()}
    summary = json.loads((both_ways / "run" / "summary.json").read_text())
    # every judge request of the CLI run was answered from the cache the inspect run filled: same requests
    n_judge_requests = sum(3 if r.task == "inference" else 1 for r in cli.values() if r.candidate_answer)
    assert summary["requests"]["cached"] == n_judge_requests and summary["requests"]["sent"] <= 6

    inference = found["cupid/inference"]
    assert inference.eval.metadata["cupid"]["candidate_constrained"] == ["inference"]
    for sample in inference.samples:
        score = sample.scores["cupid_scorer"]
        record = cli[(sample.id, "inference")]
        assert (
            record.scored and UnitRecord.model_validate(score.metadata) == record
        )  # the whole unit, answers and labels
        assert score.value == record.scores.as_dict()
        assert score.answer == record.inferred_preference and record.infer_to_gt[0].label in score.explanation
    metrics = {name: m.value for name, m in inference.results.scores[0].metrics.items()}
    block = summary["inference"]
    assert inference.results.scores[0].scored_samples == block["n_scored"] == 3
    assert metrics["micro_f1"] == pytest.approx(block["micro"]["f1"]) and metrics["macro_recall"] == pytest.approx(
        block["macro"]["recall"]
    )
    for t, b in block["by_type"].items():
        assert metrics[f"{t}/micro_precision"] == pytest.approx(b["micro"]["precision"])
    # Too few personas for an interval (personas resampled, as the report's): no bounds among inspect's metrics.
    bounds = INFERENCE.intervals(cli.values())["micro_f1"]
    assert bounds.personas < MIN_PERSONAS and (bounds.low, bounds.high) == (None, None)
    assert not [name for name in metrics if name.endswith(("_low", "_high"))]


def test_a_failed_stage_is_an_unscored_sample_counted_as_the_cli_counts_it(both_ways):
    generation = logs(both_ways / "logs")["cupid/generation"]
    cli = {(r.key, r.task): r for r in RunDir(both_ways / "run").read()}
    summary = json.loads((both_ways / "run" / "summary.json").read_text())["generation"]
    # the judge is the random-weight model without its format: its noise cannot hold '### Evaluation Score', so
    # every unit fails at the judge, kept out of every figure with the stage and the reason: never a zero
    for sample in generation.samples:
        score, record = sample.scores["cupid_scorer"], cli[(sample.id, "generation")]
        assert UnitRecord.model_validate(score.metadata) == record
        assert not record.scored and (record.error.stage, record.error.reason) == ("judge", "parse_error")
        assert math.isnan(score.value) and score.reason == "judge: parse_error"
        assert score.explanation == record.error.detail
    assert len(generation.samples) == summary["n_failed"] == 3
    result = generation.results.scores[0]
    assert (result.scored_samples, result.unscored_samples) == (summary["n_scored"], summary["n_failed"])
    if summary["mean_score"] is not None:
        assert result.metrics["mean_score"].value == pytest.approx(summary["mean_score"])
    else:
        assert "mean_score" not in result.metrics


def test_the_imported_log_is_the_cli_runs_run_directory(both_ways):
    cli = json.loads((both_ways / "run" / "summary.json").read_text())
    imported = json.loads((both_ways / "imported" / "summary.json").read_text())
    assert {k: v for k, v in imported.items() if k not in RUN_ONLY} == {
        k: v for k, v in cli.items() if k not in RUN_ONLY
    }
    assert imported["roles"]["candidate"] == "openai-api/tiny/tiny-random-llama (inspect-ai)"
    assert sorted(RunDir(both_ways / "imported").read(), key=lambda r: r.unit) == sorted(
        RunDir(both_ways / "run").read(), key=lambda r: r.unit
    )
    # the same data (the bundled sample) to `cupid compare`, as two CLI runs of it would be
    compared = cupid("compare", str(both_ways / "run"), str(both_ways / "imported"), "--json", cwd=both_ways)
    assert compared.returncode == 0, compared.stderr
    assert [d for d in json.loads(compared.stdout)["differs"] if d.startswith("data")] == []
    assert RunDir(both_ways / "imported").identity().data == RunDir(both_ways / "run").identity().data == "sample"
    # what reads run directories reads it
    for command in ("report", "view"):
        page = cupid(command, str(both_ways / "imported"), cwd=both_ways)
        assert page.returncode == 0 and Path(page.stdout.strip().splitlines()[-1]).is_file(), page.stderr


def test_a_candidate_that_gives_no_answer_fails_at_its_stage_as_in_the_runner(tmp_path, tiny_server, cupid_home):
    """A cap beyond the model's window: vLLM refuses the request (HTTP 400), in inspect as in the runner."""
    url = tiny_server["base_url"]
    endpoints = write_endpoints(tmp_path / "ep.yaml", cand={**tiny_server, "max_tokens": 9000}, freejudge=tiny_server)
    common = [
        "-T",
        "setting=oracle",
        "-T",
        "limit=1",
        "-T",
        "judge=freejudge",
        "-T",
        f"endpoints={endpoints}",
        "-T",
        "no_cache=true",
    ]
    inspected = inspect_eval(
        "cupid/generation",
        *common,
        "-T",
        "max_tokens=9000",
        "--log-dir",
        str(tmp_path / "logs"),
        cwd=tmp_path,
        base_url=url,
    )
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr
    ran = cupid("eval", "run", "--endpoints", str(endpoints), "--candidate", "cand", "--judge", "freejudge",
                "--task", "generation", "--setting", "oracle", "--limit", "1",
                "--out", str(tmp_path / "run"), "--no-cache", cwd=tmp_path)  # fmt: skip
    assert ran.returncode == 1, ran.stderr
    [sample] = logs(tmp_path / "logs")["cupid/generation"].samples
    score = sample.scores["cupid_scorer"]
    [record] = RunDir(tmp_path / "run").read()
    assert (
        math.isnan(score.value)
        and score.reason == "generate: http_400" == f"{record.error.stage}: {record.error.reason}"
    )
    assert "max_model_len" in score.explanation and "max_model_len" in record.error.detail
    imported = cupid(
        "import-inspect",
        *map(str, (tmp_path / "logs").glob("*.eval")),
        "--out",
        str(tmp_path / "imported"),
        cwd=tmp_path,
    )
    assert imported.returncode == 0, imported.stderr
    assert json.loads((tmp_path / "imported" / "summary.json").read_text())["failures"] == {
        "generation/generate: http_400": 1
    }


def test_import_refuses_what_is_not_a_cupid_log(tmp_path):
    bogus = tmp_path / "x.json"
    bogus.write_text("{}")
    result = cupid("import-inspect", str(bogus), "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert result.returncode == 2 and str(bogus) in result.stderr and not (tmp_path / "run").exists()


def test_the_summary_setting_asks_the_candidate_with_the_runners_summaries(tmp_path, tiny_server, cupid_home):
    """The prompt is built in inspect's solver from the summarizer's summaries: the CLI run of the same unit on the
    same cache finds every summary there and gets the same answer and score."""
    url = tiny_server["base_url"]
    endpoints = write_endpoints(
        tmp_path / "ep.yaml",
        cand=tiny_server,
        summarizer={**tiny_server, "structured_output": True},
        freejudge=tiny_server,
    )
    cache = tmp_path / "cache.sqlite"
    inspected = inspect_eval("cupid/generation", "-T", "setting=summary", "-T", "limit=1",
                             "-T", "summarizer=summarizer", "-T", "judge=freejudge",
                             "-T", f"endpoints={endpoints}", "-T", f"cache={cache}",
                             "-T", f"max_tokens={tiny_server['max_tokens']}",
                             "--log-dir", str(tmp_path / "logs"), cwd=tmp_path, base_url=url)  # fmt: skip
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr
    [sample] = logs(tmp_path / "logs")["cupid/generation"].samples
    assert "### Session 1" in sample.messages[1].text  # the summaries' layout in place of the log
    ran = cupid("eval", "run", "--endpoints", str(endpoints), "--candidate", "cand", "--summarizer", "summarizer",
                "--judge", "freejudge", "--task", "generation", "--setting", "summary", "--limit", "1",
                "--out", str(tmp_path / "run"), "--cache", str(cache), "--allow-failures", cwd=tmp_path)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    [record] = RunDir(tmp_path / "run").read()
    assert UnitRecord.model_validate(sample.scores["cupid_scorer"].metadata) == record and record.candidate_answer
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["requests"]["cached"] == record.n_sessions + (
        record.judge_answer is not None
    )  # the summaries, the judge


def test_a_task_asks_the_runners_prompt_with_the_shipped_judges():
    built = inspect_tasks.inference(setting="oracle", types=["changing", "contrastive"])
    meta = built.metadata["cupid"]
    assert meta["roles"] == {
        "decomposer": "qwen2.5-7b-instruct (Qwen/Qwen2.5-7B-Instruct)",
        "matcher": "prefmatcher (kixlab/prefmatcher-7b)",
    }
    cfg = RunConfig(
        candidate="qwen2.5-7b-instruct", decomposer="qwen2.5-7b-instruct", matcher="prefmatcher", settings=["oracle"]
    )
    runner = build_tasks(cfg, Client(load_endpoints("configs/endpoints.yaml")))["inference"]
    instances = {i.key: i for i in load("sample").instances}
    assert {instances[s.id].instance_type for s in built.dataset} == {"changing", "contrastive"} and len(
        built.dataset
    ) == meta["n_instances"]
    for sample in built.dataset:  # the request the runner sends, message for message
        sent = runner.plain_request(instances[sample.id], "oracle").body()["messages"]
        assert [(m.role, m.text) for m in sample.input] == [(m["role"], m["content"]) for m in sent]
    # the run's data as a CLI run records it: the bundled sample is `sample`, however the task was given it
    assert meta["data"] == inspect_tasks.inference(data=str(SAMPLE_PATH)).metadata["cupid"]["data"] == "sample"
    # the summary setting takes the shipped run's summarizer
    assert (
        inspect_tasks.inference(setting="summary")
        .metadata["cupid"]["roles"]["summarizer"]
        .startswith("qwen2.5-7b-instruct")
    )


def test_a_task_refuses_a_setting_or_instance_type_it_has_not():
    with pytest.raises(ConfigError, match="oracle-preference"):
        inspect_tasks.inference(setting="oracle-preference")
    with pytest.raises(ConfigError, match="sometimes"):
        inspect_tasks.inference(types="sometimes")


@pytest.mark.slow  # ~11 s (a whole inspect eval of both tasks, in process): `make test` runs it
def test_inspect_closes_each_tasks_judges_once_on_the_runs_loop(tmp_path, instant_url, monkeypatch):
    """In process, as a notebook runs it: both tasks' judges (one client each, with the cache) are closed once, by
    the run-end hook, on the loop the samples ran on; none is left open for the next run."""
    from inspect_ai import eval as run_inspect

    closed: list[tuple[int, int]] = []
    real = Client.close_with_cache

    async def counted(self: Client) -> None:
        closed.append((id(self), id(asyncio.get_running_loop())))
        await real(self)

    monkeypatch.setattr(Client, "close_with_cache", counted)
    monkeypatch.setenv("TINY_BASE_URL", instant_url)
    monkeypatch.setenv("TINY_API_KEY", "EMPTY")
    endpoints = write_endpoints(tmp_path / "ep.yaml", instant={"base_url": instant_url, "model": "instant"})
    common = {"setting": "oracle", "limit": 2, "endpoints": str(endpoints), "cache": str(tmp_path / "c.sqlite")}
    tasks = [
        inspect_tasks.inference(decomposer="instant", matcher="instant", **common),
        inspect_tasks.generation(judge="instant", **common),
    ]
    found = run_inspect(tasks, model="openai-api/tiny/instant", display="none", log_dir=str(tmp_path / "logs"))
    assert [log.status for log in found] == ["success", "success"]
    assert [log.results.scores[0].scored_samples for log in found] == [2, 2]  # the judges answered, then were closed
    assert len(closed) == len({client for client, _ in closed}) == 2  # a client per task, each closed once
    assert len({loop for _, loop in closed}) == 1 and not inspect_tasks._OPEN


def test_the_tasks_are_named_under_cupid_in_an_editable_install_of_cupid_eval():
    """The distribution is `cupid-eval`, the package `cupid`: inspect gives a checkout's editable install no prefix of
    its own (the bare `task` below), so `inspect eval cupid/inference` would find nothing without the name given."""
    from inspect_ai import task
    from inspect_ai.util import registry_info

    assert registry_info(inspect_tasks.inference).name == "cupid/inference"
    assert registry_info(inspect_tasks.generation).name == "cupid/generation"
    bare = registry_info(task(inspect.unwrap(inspect_tasks.inference))).name
    assert bare in ("inference", "cupid/inference")  # the first in a checkout, the second from a wheel
