"""PrefMatcher as a TRL reward, called as TRL's GRPOTrainer calls it, against the answers `cupid eval run` scored:
the session's vLLM server (the random-weight model held to the formats) as matcher, the instant server as decomposer
(its checklist is matched; the random model's held answer is an empty one)."""

import asyncio
import json
import pickle

import pytest

import cupid
from cupid.common.config import ConfigError
from cupid.eval.benchmark.rundir import RunDir
from cupid.eval.benchmark.runner import RunConfig, dry_run, run
from cupid.matcher.parse import PREFERENCE_HEADER
from cupid.serving.endpoint import Endpoint
from cupid.serving.servers.instant import PREFERENCE as INSTANT_PREFERENCE
from cupid.serving.servers.ports import free_port

N = 3


@pytest.fixture(scope="module")
def scored(tmp_path_factory, instant_url, tiny_server, session_home):
    """N instances scored by the runner, and the judges that scored them."""
    home = tmp_path_factory.mktemp("reward")
    matcher, decomposer = (
        Endpoint(**tiny_server, structured_output=True),
        Endpoint(base_url=instant_url, model="instant"),
    )
    endpoints = home / "endpoints.yaml"
    endpoints.write_text(f"instant: {decomposer.model_dump_json()}\ntinyformat: {matcher.model_dump_json()}\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUPID_HOME", str(session_home))
        run(
            RunConfig(
                endpoints=str(endpoints),
                candidate="instant",
                decomposer="instant",
                matcher="tinyformat",
                limit=N,
                out=str(home / "run"),
                cache=str(home / "cache.sqlite"),
            )
        )
    by_key = {r.key: r for r in RunDir(home / "run").read()}
    records = [by_key[key] for key in cupid.reward_dataset("sample", limit=N)["key"]]  # in the data's order
    assert all(r.scored for r in records) and any(r.inferred_checklist for r in records)
    return records, matcher, decomposer, home / "cache.sqlite"


def trl_call(func, dataset, completions, logged=None):
    """As GRPOTrainer._calculate_rewards calls an async reward: the dataset's other columns as keyword lists."""
    columns = {k: dataset[k] for k in dataset.column_names if k != "prompt"}
    log_metric = (lambda name, value: logged.__setitem__(name, value)) if logged is not None else None
    return asyncio.run(
        func(
            prompts=dataset["prompt"],
            completions=completions,
            completion_ids=None,
            trainer_state=None,
            log_extra=None,
            log_metric=log_metric,
            **columns,
        )
    )


def test_rewards_equal_the_f1_the_run_recorded_in_plain_and_chat_form(scored):
    # TRL's utils here, not at collection: importing them imports torch and transformers
    from trl.trainer.utils import get_callable_name, is_async_callable

    records, matcher, decomposer, cache = scored
    dataset = cupid.reward_dataset("sample", limit=N)
    assert list(dataset["current_checklist"]) == [r.gt_checklist for r in records]
    answers = [r.candidate_answer for r in records]
    want = [r.scores.f1 for r in records]

    reward = cupid.reward(matcher=matcher, decomposer=decomposer, cache=cache)
    assert (
        is_async_callable(reward) and get_callable_name(reward) == "cupid_inference_f1"
    )  # TRL logs rewards/cupid_inference_f1/mean
    logged = {}
    assert trl_call(reward, dataset, answers, logged) == pytest.approx(want)
    assert (
        logged["cupid/inference/requests_sent"] == 0 < logged["cupid/inference/cache_hits"]
    )  # the run's requests, keys and all
    assert logged["cupid/inference/judge_failure_rate"] == 0.0
    chat = [[{"role": "assistant", "content": a}] for a in answers]
    assert trl_call(reward, dataset, chat) == trl_call(reward, dataset, answers)
    # asked afresh, without the run's cache: the same answers (greedy), so the same rewards
    fresh = cupid.reward(matcher=matcher, decomposer=decomposer)
    assert trl_call(pickle.loads(pickle.dumps(fresh)), dataset, answers) == pytest.approx(
        want
    )  # it pickles, and works unpickled
    blocking = cupid.reward(matcher=matcher, decomposer=decomposer, cache=cache, blocking=True)
    assert blocking(
        prompts=dataset["prompt"], completions=answers, **{k: dataset[k] for k in dataset.column_names if k != "prompt"}
    ) == pytest.approx(want)


def test_a_stopped_judge_gives_none_where_a_missing_preference_gives_zero(scored):
    records, _, _, _ = scored
    dataset = cupid.reward_dataset("sample", limit=N)
    answers = [
        "I would rather not say.",
        records[1].candidate_answer,
        f"{PREFERENCE_HEADER}\nShort answers with numbers first.",
    ]

    stopped = Endpoint(base_url=f"http://127.0.0.1:{free_port()}/v1", model="stopped", max_retries=0, timeout_s=5)
    logged = {}
    assert trl_call(cupid.reward(matcher=stopped, decomposer=stopped), dataset, answers, logged) == [0.0, None, None]
    assert logged["cupid/inference/judge_failure_rate"] == pytest.approx(2 / 3)


def test_an_answer_given_twice_in_a_batch_is_judged_once(scored, instant_url):
    records, _, decomposer, _ = scored
    dataset = cupid.reward_dataset("sample", limit=N)
    answers = [records[1].candidate_answer, f"{PREFERENCE_HEADER}\nShort answers with numbers first."]
    judges = Endpoint(base_url=instant_url, model="local-prefmatcher")
    same_row = dataset.select([1, 1, 1])
    logged = {}
    rewards = trl_call(
        cupid.reward(matcher=judges, decomposer=decomposer), same_row, [answers[1], answers[1], answers[0]], logged
    )
    assert rewards[0] == rewards[1] and all(r is not None for r in rewards)
    assert logged["cupid/inference/requests_sent"] == 2 * 3  # two distinct answers: decompose + two matches each


def test_the_generation_reward_is_the_runs_judge_score_scaled(tmp_path, instant_url, cupid_home):
    from trl.trainer.utils import get_callable_name

    judge = Endpoint(base_url=instant_url, model="judge")
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text(
        f"instant: {Endpoint(base_url=instant_url, model='instant').model_dump_json()}\n"
        f"judge: {judge.model_dump_json()}\n"
    )
    run(
        RunConfig(
            endpoints=str(endpoints),
            candidate="instant",
            decomposer="instant",
            judge="judge",
            tasks=["generation"],
            limit=N,
            out=str(tmp_path / "run"),
            cache=str(tmp_path / "cache.sqlite"),
        )
    )
    by_key = {r.key: r for r in RunDir(tmp_path / "run").read()}
    dataset = cupid.reward_dataset("sample", task="generation", limit=N)
    records = [by_key[key] for key in dataset["key"]]
    assert all(r.scored for r in records)
    reward = cupid.reward("generation", judge=judge, cache=tmp_path / "cache.sqlite")
    assert get_callable_name(reward) == "cupid_generation_score"
    logged = {}
    assert trl_call(reward, dataset, [r.candidate_answer for r in records], logged) == pytest.approx(
        [(r.score - 1) / 9 for r in records]
    )
    assert logged["cupid/generation/requests_sent"] == 0  # the run's judge requests, answered by its cache


def test_the_generation_reward_refuses_an_inference_metric():
    with pytest.raises(cupid.api.ConfigError, match="metric 'f1' for generation"):
        cupid.reward("generation", judge=Endpoint(base_url="http://127.0.0.1:9/v1", model="j"), metric="f1")


def test_a_summary_dataset_needs_a_summarizer_that_answers():
    with pytest.raises(
        cupid.api.ConfigError,
        match="summary setting needs the summarizer's answers to build its prompts: pass summarizer=",
    ):
        cupid.reward_dataset("sample", setting="summary", limit=1)
    with pytest.raises(cupid.api.ConfigError, match="reward_dataset: sample-01/consistent: summarize: connection"):
        cupid.reward_dataset(
            "sample",
            setting="summary",
            limit=1,
            summarizer=Endpoint(base_url=f"http://127.0.0.1:{free_port()}/v1", model="s", max_retries=0, timeout_s=5),
        )


def test_a_generation_dataset_ends_on_the_users_turn_with_its_preference():
    generation = cupid.reward_dataset("sample", task="generation", setting="oracle-preference", limit=1)
    assert (
        generation["prompt"][0][-1]["role"] == "user"
        and generation["current_contextual_preference"][0] in generation["prompt"][0][-1]["content"]
    )


def test_the_generation_reward_is_an_async_callable_named_for_trl():
    from trl.trainer.utils import get_callable_name, is_async_callable

    reward = cupid.reward("generation", judge=Endpoint(base_url="http://127.0.0.1:9/v1", model="j"))
    assert get_callable_name(reward) == "cupid_generation_score" and is_async_callable(reward)


def test_the_datasets_prompts_are_the_runners_requests(tmp_path, instant_url):
    """Standard and oracle: the messages `cupid eval run --dry-run` writes, row for row; summary: built from the
    summarizer's answers (the instant server's), as the runner builds it."""
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text(f"instant: {Endpoint(base_url=instant_url, model='instant').model_dump_json()}\n")
    for setting in ("standard", "oracle"):
        batch = tmp_path / f"{setting}.jsonl"
        dry_run(
            RunConfig(
                endpoints=str(endpoints),
                candidate="instant",
                decomposer="instant",
                matcher="instant",
                settings=[setting],
                limit=N,
            ),
            batch,
        )
        sent = [json.loads(line)["body"]["messages"] for line in batch.read_text().splitlines()]
        assert cupid.reward_dataset("sample", setting=setting, limit=N)["prompt"] == sent
    summary = cupid.reward_dataset(
        "sample", setting="summary", limit=1, summarizer=Endpoint(base_url=instant_url, model="instant")
    )
    assert (
        "#### Preferences" in summary["prompt"][0][-1]["content"]
        and INSTANT_PREFERENCE in summary["prompt"][0][-1]["content"]
    )


def test_the_format_reward_grades_the_form_of_what_the_judges_scored(scored, instant_url, tmp_path):
    from trl.trainer.utils import get_callable_name

    from cupid.eval.integrations.reward import format_reward

    records, _, decomposer, _ = scored
    dataset = cupid.reward_dataset("sample", limit=4)
    answers = [
        "I would rather not say.",  # no header at all: 0
        records[1].candidate_answer,  # the instant server's: both headers, one short sentence: 1
        f"{PREFERENCE_HEADER}\nShort answers with numbers first.",  # a heading, not the analysis's: 0.9
        "# Notes\nThe most likely preference is brevity.",  # a heading, the header's words: 0.2
    ]
    judge_reward = cupid.reward(
        matcher=Endpoint(base_url=instant_url, model="local-prefmatcher"), decomposer=decomposer
    )
    graded = format_reward(judge_reward)
    assert get_callable_name(graded) == "cupid_inference_format"

    async def batch(rewarding, shaping):  # as TRL gathers a batch's async reward functions on its one loop
        logged = {}
        columns = {k: dataset[k] for k in dataset.column_names if k != "prompt"}
        call = {"prompts": dataset["prompt"], "completions": answers, "completion_ids": None, **columns}
        results = await asyncio.gather(
            rewarding(**call, log_metric=logged.__setitem__), shaping(**call, log_metric=lambda *_: None)
        )
        return (*results, logged)

    judged, form, logged = asyncio.run(batch(judge_reward, graded))
    assert form == [0.0, 1.0, 0.9, 0.2] and judged[0] == judged[3] == 0.0 and None not in judged
    assert logged["cupid/inference/requests_sent"] == 2 * 3  # each answer scored once for both rewards

    stopped = Endpoint(base_url=f"http://127.0.0.1:{free_port()}/v1", model="stopped", max_retries=0, timeout_s=5)
    judge_reward = cupid.reward(matcher=stopped, decomposer=stopped)
    judged, form, logged = asyncio.run(batch(judge_reward, format_reward(judge_reward)))
    assert judged == [0.0, None, None, 0.0] and form == [0.0, None, None, 0.2]  # None where the judges failed

    # Judges that cannot even be opened (the cache is not a cache): every reward None, the failure rate still logged.
    (tmp_path / "bad.sqlite").write_text("not a cache")
    judge_reward = cupid.reward(matcher=stopped, decomposer=stopped, cache=tmp_path / "bad.sqlite")
    judged, form, logged = asyncio.run(batch(judge_reward, format_reward(judge_reward)))
    assert judged == form == [None] * 4 and logged == {
        "cupid/inference/judge_failure_rate": 1.0,
        "cupid/inference/seconds_per_batch": pytest.approx(logged["cupid/inference/seconds_per_batch"]),
    }
    with pytest.raises(ConfigError, match="free text"):
        format_reward(cupid.reward("generation", judge=stopped))


def test_every_reward_a_task_declares_has_its_function_named_as_trl_logs_it():
    from cupid.eval.benchmark.tasks import TASKS
    from cupid.eval.integrations.reward import FUNCTIONS

    declared = {(spec.name, metric) for spec in TASKS.values() for metric in spec.reward_metrics}
    assert set(FUNCTIONS) == declared
    for (task, metric), (func, twin) in FUNCTIONS.items():
        assert func.__name__ == f"cupid_{task}_{metric}" and twin.__name__ == f"{func.__name__}_blocking"
        off = Endpoint(base_url="http://127.0.0.1:9/v1", model="m")  # nothing asked: the function is only bound
        assert cupid.reward(task, metric=metric, judge=off, matcher=off, decomposer=off).func is func
