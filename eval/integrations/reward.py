"""PrefMatcher as a training reward: `cupid.reward(...)` gives a reward function with TRL's contract, and
`cupid.reward_dataset(...)` the prompts it rewards answers to.

The contract (TRL's `GRPOTrainer`, `reward_funcs`): called with `prompts`, `completions` (strings, or chat messages
whose last assistant turn is the answer), `completion_ids` and the dataset's other columns as keyword lists; returns
one `float | None` per completion, None being a reward TRL skips. Each completion is scored exactly as
`cupid eval run` scores a candidate answer, with the same parser, judges and requests (so the same cache keys):
- the policy's own failure (no preference in its answer: the runner's `parse_preference` failure) is its reward, 0.0;
- a judge's failure (unreachable, an unparseable judge answer after the client's retries) is None; nothing raises.

The function is a `functools.partial` of a module-level `async def` named for what it logs (TRL logs
`rewards/<name>/mean`, reading the wrapped function's `__name__`), bound to a `Judges` of endpoints and paths:
it pickles (TRL's async GRPO sends reward functions to another process) and opens its HTTP client lazily on the
event loop that calls it (TRL runs async rewards on a loop of its own). One call is one batch: identical
(answer, ground truth) pairs within it are asked once, and the endpoints' concurrency limits apply.

`format_reward(reward)` is a second reward on the same judges (TRL's `reward_weights` weigh the two): a graded
score of the inference answer's form, so a group of answers of a small policy that rarely states a preference still
has rewards that vary. It shares the judges' scoring of each answer (asked once for both) and is None wherever the
judges failed: TRL skips a completion only when every reward function gives None, so a format reward that still
scored it would train on a judge's failure as if it were a low reward.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cupid.common.aio import PerLoop, blocking
from cupid.common.config import ConfigError
from cupid.eval.benchmark import data as cupid_data
from cupid.eval.benchmark.history import History, plain_log
from cupid.eval.benchmark.inference import INFERENCE
from cupid.eval.benchmark.judges import Judging, open_judges
from cupid.eval.benchmark.records import Scoring
from cupid.eval.benchmark.settings import SETTING_SPECS
from cupid.eval.benchmark.stages import StageFailed
from cupid.eval.benchmark.tasks import TASKS, TaskName
from cupid.matcher import parse
from cupid.matcher.parse import PREFERENCE_HEADER
from cupid.serving.cache import open_cache
from cupid.serving.client import Client, per_loop
from cupid.serving.endpoint import Endpoint
from cupid.serving.registry import DEFAULT_FILE, EndpointLike, resolve
from cupid.serving.servers.lifecycle import live_endpoints

REMEMBERED = 4096  # scorings a Judges keeps per loop: a batch's, for its other reward function
MAX_PREFERENCE_WORDS = 30  # the inference prompt asks for one sentence of at most 30 words


@dataclass(frozen=True)
class Judges:
    """What a reward function is bound to: the task, the figure rewarded, each judge role's endpoint, the cache file
    and the concurrency. Data only, so it pickles; the client is opened per process and event loop."""

    task: TaskName
    metric: str
    endpoints: tuple[tuple[str, Endpoint], ...]
    cache: str | None = None
    max_concurrency: int | None = None
    _opened: PerLoop[Judging] = field(init=False, compare=False, repr=False)
    _memo: dict[Any, dict[Any, Any]] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        judging = per_loop(
            lambda: open_judges(TASKS[self.task], dict(self.endpoints), self.cache, self.max_concurrency)
        )
        object.__setattr__(self, "_opened", judging)
        object.__setattr__(self, "_memo", {})

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_opened", "_memo")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__post_init__()

    async def opened(self) -> Judging:
        """This event loop's client and scorer, opened on its first call."""
        return await self._opened.get()

    async def scorings(self, asked: Sequence[tuple[str, tuple[Any, ...]]]) -> list[Scoring | BaseException]:
        """Each (answer, ground truth)'s scoring, asked once whichever reward function of a batch asks first (the
        judge's and the format's run side by side on one loop); the last `REMEMBERED` are kept."""
        _, scorer = await self.opened()
        memo = self._memo.setdefault(asyncio.get_running_loop(), {})
        tasks = []
        for answer, row in asked:
            if (answer, row) not in memo:
                memo[answer, row] = asyncio.ensure_future(_score(self, scorer, answer, row))
                while len(memo) > REMEMBERED:
                    memo.pop(next(iter(memo)))
            tasks.append(memo[answer, row])
        return await asyncio.gather(*tasks, return_exceptions=True)

    async def aclose(self) -> None:
        self._memo.pop(asyncio.get_running_loop(), None)
        await self._opened.aclose()


def answer_of(completion: str | list[dict[str, Any]]) -> str:
    """A completion's answer: the string, or the content of its last assistant message."""
    if isinstance(completion, str):
        return completion
    for message in reversed(completion):
        if message.get("role") == "assistant":
            return str(message.get("content") or "")
    return ""


def value(task: str, metric: str, scoring: Scoring) -> float | None:
    """A scoring's reward (the task's `reward_of`: F1, or a judge score 1-10 scaled to [0, 1]), 0.0 for the policy's
    own failure (no preference in its answer), None for a judge's."""
    spec = TASKS[task]
    if not scoring.scored:
        return 0.0 if spec.candidate_failed(scoring) else None
    return spec.reward_of(scoring, metric)


async def _score(judges: Judges, scorer: Any, answer: str, row: tuple[Any, ...]) -> Scoring:
    return await scorer.score_truth(answer, dict(zip(TASKS[judges.task].ground_truth, row, strict=True)))


def _rows(judges: Judges, completions: Sequence[Any], columns: dict[str, Any]) -> list[tuple[str, tuple[Any, ...]]]:
    names = TASKS[judges.task].ground_truth
    missing = [n for n in names if n not in columns]
    if missing:
        raise ConfigError(
            f"cupid reward ({judges.task}): the dataset has no column {missing[0]!r} (cupid.reward_dataset gives it)"
        )
    rows = [
        tuple(tuple(v) if isinstance(v, list) else v for v in values)
        for values in zip(*(columns[n] for n in names), strict=True)
    ]
    return [(answer_of(c), row) for c, row in zip(completions, rows, strict=True)]


async def _judged(
    judges: Judges, asked: list[tuple[str, tuple[Any, ...]]]
) -> tuple[list[float | None], tuple[int, int] | None]:
    """Each answer's reward (`value`; None where the judges could not score it, or could not even be reached), and
    the requests sent and answered from the cache meanwhile (None: the judges were not reached)."""
    try:
        client, _ = await judges.opened()
        before = (client.stats.sent, client.stats.cached)
        scorings = await judges.scorings(asked)
    except Exception:  # noqa: BLE001 (the judges could not be reached: every completion is skipped, training goes on)
        return [None] * len(asked), None
    counts = (client.stats.sent - before[0], client.stats.cached - before[1])
    return [value(judges.task, judges.metric, s) if isinstance(s, Scoring) else None for s in scorings], counts


async def rewards(judges: Judges, completions: Sequence[Any], columns: dict[str, Any]) -> list[float | None]:
    """One batch's rewards (what every judge reward function of this module computes)."""
    log_metric: Callable[[str, float], None] | None = columns.get("log_metric")
    asked = _rows(judges, completions, columns)
    started = time.monotonic()
    out, counts = await _judged(judges, asked)
    if log_metric is not None:  # every batch, one whose judges could not be reached included
        prefix = f"cupid/{judges.task}"
        log_metric(f"{prefix}/judge_failure_rate", sum(r is None for r in out) / max(len(out), 1))
        if counts is not None:
            log_metric(f"{prefix}/requests_sent", float(counts[0]))
            log_metric(f"{prefix}/cache_hits", float(counts[1]))
        log_metric(f"{prefix}/seconds_per_batch", time.monotonic() - started)
    return out


def form(answer: str) -> float:
    """The inference answer's form, graded, so that an answer closer to the asked format earns more: the analysis
    header 0.2 (any markdown heading 0.1), the preference header 0.2 (its words in any case 0.1), a preference after
    it (what the runner parses) 0.3, and that preference in at most `MAX_PREFERENCE_WORDS` words 0.3. The partial
    steps are for a small policy that has not met the format yet: its answers then differ in form, and a group's
    rewards vary."""
    headings = [line for line in answer.splitlines() if line.lstrip().startswith("#")]
    score = 0.2 if "### Analysis" in answer else 0.1 if headings else 0.0
    score += 0.2 if PREFERENCE_HEADER in answer else 0.1 if "most likely preference" in answer.lower() else 0.0
    try:
        stated = parse.preference(answer)
    except parse.ParseError:
        return round(score, 2)
    return round(score + 0.3 + 0.3 * (len(stated.split()) <= MAX_PREFERENCE_WORDS), 2)


async def cupid_inference_format(
    prompts: Any = None, completions: Sequence[Any] = (), completion_ids: Any = None, *, judges: Judges, **columns: Any
) -> list[float | None]:
    """`form` of each answer; None where the judges failed on it (as the judge reward is)."""
    asked = _rows(judges, completions, columns)
    judged, _ = await _judged(judges, asked)
    return [None if r is None else form(answer) for (answer, _), r in zip(asked, judged, strict=True)]


def format_reward(judge_reward: functools.partial[Any]) -> functools.partial[Any]:
    """The format reward beside an inference reward of `reward(...)`, on the same judges (each answer scored once):
    `reward_funcs=[r, format_reward(r)]` with TRL's `reward_weights`."""
    judges: Judges = judge_reward.keywords["judges"]
    if TASKS[judges.task].answer_format is None:
        raise ConfigError(f"format_reward: a {judges.task} answer is free text, with no form to grade")
    return functools.partial(cupid_inference_format, judges=judges)


# One module-level function per task and figure, named for what TRL logs (`rewards/<name>/mean`).
async def cupid_inference_f1(
    prompts: Any = None, completions: Sequence[Any] = (), completion_ids: Any = None, *, judges: Judges, **columns: Any
) -> list[float | None]:
    return await rewards(judges, completions, columns)


async def cupid_inference_precision(
    prompts: Any = None, completions: Sequence[Any] = (), completion_ids: Any = None, *, judges: Judges, **columns: Any
) -> list[float | None]:
    return await rewards(judges, completions, columns)


async def cupid_inference_recall(
    prompts: Any = None, completions: Sequence[Any] = (), completion_ids: Any = None, *, judges: Judges, **columns: Any
) -> list[float | None]:
    return await rewards(judges, completions, columns)


async def cupid_generation_score(
    prompts: Any = None, completions: Sequence[Any] = (), completion_ids: Any = None, *, judges: Judges, **columns: Any
) -> list[float | None]:
    return await rewards(judges, completions, columns)


def _blocking_twin(afunc: Callable[..., Any]) -> Callable[..., list[float | None]]:
    def call(
        prompts: Any = None,
        completions: Sequence[Any] = (),
        completion_ids: Any = None,
        *,
        judges: Judges,
        **columns: Any,
    ) -> list[float | None]:
        async def once() -> list[float | None]:
            try:
                return await afunc(prompts, completions, completion_ids, judges=judges, **columns)
            finally:
                await judges.aclose()

        return blocking(once)

    call.__name__ = call.__qualname__ = afunc.__name__ + "_blocking"
    return call


# the blocking twins, for trainers that call reward functions synchronously (TRL's online DPO)
cupid_inference_f1_blocking = _blocking_twin(cupid_inference_f1)
cupid_inference_precision_blocking = _blocking_twin(cupid_inference_precision)
cupid_inference_recall_blocking = _blocking_twin(cupid_inference_recall)
cupid_generation_score_blocking = _blocking_twin(cupid_generation_score)

FUNCTIONS = {  # (task, metric) -> the function and its blocking twin, read off the name TRL logs
    tuple(f.__name__.removeprefix("cupid_").split("_", 1)): (f, twin)
    for f, twin in (
        (cupid_inference_f1, cupid_inference_f1_blocking),
        (cupid_inference_precision, cupid_inference_precision_blocking),
        (cupid_inference_recall, cupid_inference_recall_blocking),
        (cupid_generation_score, cupid_generation_score_blocking),
    )
}


def reward(
    task: TaskName = INFERENCE.name,
    *,
    matcher: EndpointLike = "prefmatcher",
    decomposer: EndpointLike = "decomposer",
    judge: EndpointLike = "judge",
    endpoints_file: str | Path = DEFAULT_FILE,
    metric: str | None = None,
    cache: str | Path | None = None,
    max_concurrency: int | None = None,
    blocking: bool = False,
) -> functools.partial[Any]:
    """PrefMatcher as a reward for TRL's `GRPOTrainer` (`reward_funcs=[cupid.reward()]`): each completion scored as
    `cupid eval run` scores a candidate answer. Inference rewards the inferred preference's `f1` (or `precision`,
    `recall`) under `decomposer` and `matcher`; generation the `judge`'s score scaled to [0, 1]. Each role is a name,
    an `Endpoint` or a base URL. An answer without a preference is 0.0; a judge's failure is None (TRL skips it). Async
    and picklable; `blocking=True` gives the synchronous twin (TRL's online DPO). The dataset's columns must hold the
    ground truth: `reward_dataset`."""
    if (spec := TASKS.get(task)) is None:
        raise ConfigError(f"reward: task {task!r}: expected one of {', '.join(TASKS)}")
    metric = metric or spec.reward_metrics[0]
    if metric not in spec.reward_metrics:
        raise ConfigError(f"reward: metric {metric!r} for {task}: expected one of {', '.join(spec.reward_metrics)}")
    given = {"matcher": matcher, "decomposer": decomposer, "judge": judge}
    endpoints = tuple(
        (role, resolve(given[role], endpoints_file=endpoints_file, started=live_endpoints)) for role in spec.roles
    )
    judges = Judges(task, metric, endpoints, str(cache) if cache else None, max_concurrency)
    return functools.partial(FUNCTIONS[(task, metric)][1 if blocking else 0], judges=judges)


def reward_dataset(
    source: str | Path = "sample",
    task: TaskName = INFERENCE.name,
    setting: str = "standard",
    *,
    summarizer: EndpointLike | None = None,
    cache: str | Path | None = None,
    endpoints_file: str | Path = DEFAULT_FILE,
    types: Sequence[str] | None = None,
    limit: int | None = None,
) -> Any:
    """The prompts a reward is given answers to, as a `datasets.Dataset`: `prompt` holds the runner's candidate prompt
    as chat messages (what `cupid eval run` sends), beside the ground truth (`current_contextual_preference`,
    `current_checklist`, `current_request`) and the instance's key, persona and type. Any CUPID-format data:
    the benchmark, the sample, what `cupid synth` writes. The summary setting needs `summarizer` (its answers go through
    `cache`, as a run's do)."""
    import datasets

    instances = cupid_data.load(source).filter(types, limit).instances
    summarizing = (
        resolve(summarizer, endpoints_file=endpoints_file, started=live_endpoints) if summarizer is not None else None
    )
    return datasets.Dataset.from_list(dataset_rows(instances, task, setting, summarizer=summarizing, cache=cache))


def dataset_rows(
    instances: Sequence[Any],
    task: TaskName = INFERENCE.name,
    setting: str = "standard",
    *,
    summarizer: Endpoint | None = None,
    cache: str | Path | None = None,
) -> list[dict[str, Any]]:
    """One row per instance: `prompt`, the runner's candidate prompt as chat messages (the messages `cupid eval run`
    sends), and the ground-truth columns beside it. The summary setting asks `summarizer` for each session's summary
    (through `cache`, as a run does); a failed summary is an error naming the instance, never a prompt without it."""
    if setting not in TASKS[task].settings:
        raise ConfigError(
            f"reward_dataset: setting {setting!r} for {task}: expected one of {', '.join(TASKS[task].settings)}"
        )
    if (role := SETTING_SPECS[setting].built_by) is not None and summarizer is None:
        raise ConfigError(
            f"reward_dataset: the {setting} setting needs the {role}'s answers to build its prompts: pass summarizer="
        )
    spec = TASKS[task]
    logs = blocking(lambda: _logs(instances, setting, summarizer, cache))
    rows = []
    for instance, log in zip(instances, logs, strict=True):
        rows.append(
            {
                "prompt": spec.messages(log, instance, setting),
                "key": instance.key,
                "persona_id": instance.persona_id,
                "instance_type": instance.instance_type,
                "current_request": instance.current_request,
                "current_contextual_preference": instance.current_contextual_preference,
                "current_checklist": list(instance.current_checklist),
            }
        )
    return rows


async def _logs(
    instances: Sequence[Any], setting: str, summarizer: Endpoint | None, cache: str | Path | None
) -> list[str]:
    """Each instance's log as the runner builds it (`History.log`): no request but in a setting built from answers."""
    if (role := SETTING_SPECS[setting].built_by) is None:
        return [plain_log(i, setting) for i in instances]
    client = Client({role: summarizer} if summarizer else {}, open_cache(cache))
    try:
        history = History(client, role if summarizer else None)
        outcomes = await asyncio.gather(*(history.log(i, setting) for i in instances), return_exceptions=True)
    finally:
        await client.close_with_cache()
    for instance, outcome in zip(instances, outcomes, strict=True):
        if isinstance(outcome, StageFailed):
            raise ConfigError(f"reward_dataset: {instance.key}: {outcome}") from None
        if isinstance(outcome, BaseException):
            raise outcome
    return list(outcomes)  # type: ignore[arg-type]  # every failure was raised above
