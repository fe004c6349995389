"""CUPID as inspect-ai tasks: `inspect eval cupid/inference --model ANY_INSPECT_MODEL` (and `cupid/generation`).

The candidate is inspect's model, so every provider inspect knows is a candidate without an endpoints
file. The rest is this project's benchmark, not a look-alike: the sample's messages are the project's
candidate prompt byte for byte, and the scorer is the project's (decomposer then PrefMatcher both ways, or
the judge), through the same client and request cache as `cupid eval run`. The same answer therefore
sends the same judge requests and gets the same score in both. A stage that fails is an unscored sample
(inspect keeps it out of the metrics and counts it) that names the stage and the reason; it is never a
zero. Each score's metadata is the unit's record as `instances.jsonl` holds it, which is what lets
`cupid import-inspect` (`cupid.eval.integrations.inspect_log`) turn a log back into a run directory.

Installed with the `inspect` extra; inspect finds these tasks through the `inspect_ai` entry point.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.hooks import Hooks, RunEnd, hooks
from inspect_ai.model import ChatMessage, ChatMessageAssistant, ChatMessageSystem, ChatMessageUser, GenerateConfig
from inspect_ai.scorer import Metric, SampleScore, Score, Scorer, Target, metric, scorer
from inspect_ai.solver import Generate, Solver, TaskState, solver
from inspect_ai.util import registry_info

from cupid.common.aio import PerLoop
from cupid.common.config import ConfigError, read_yaml
from cupid.eval.benchmark import data as cupid_data
from cupid.eval.benchmark.data import INSTANCE_TYPES, Instance
from cupid.eval.benchmark.figures import GROUPS
from cupid.eval.benchmark.generation import GENERATION
from cupid.eval.benchmark.history import History, plain_log
from cupid.eval.benchmark.inference import INFERENCE, matcher_dialect
from cupid.eval.benchmark.judges import Judging, open_judges
from cupid.eval.benchmark.records import Scoring, StageError, UnitRecord
from cupid.eval.benchmark.settings import SETTING_SPECS, extra_prompts, extra_roles
from cupid.eval.benchmark.stages import StageFailed
from cupid.eval.benchmark.summary import figures
from cupid.eval.benchmark.tasks import TASKS, answered, unit_record
from cupid.eval.benchmark.taskspec import TaskSpec
from cupid.matcher import prompts
from cupid.serving.cache import DEFAULT as DEFAULT_CACHE
from cupid.serving.cache import cache_path
from cupid.serving.client import classify, per_loop
from cupid.serving.endpoint import Endpoint
from cupid.serving.registry import DEFAULT_FILE, URL_SCHEMES

DEFAULT_RUN = "configs/eval/default.yaml"  # whose judges are the defaults: the project's all-local ones
PREFIX = "cupid"  # inspect's namespace for these tasks: the entry point's name in pyproject.toml
METADATA_KEY = (
    "cupid"  # the task's metadata (the log's `eval.metadata`) under this key: what `import-inspect` rebuilds a run from
)


def _cupid_task(func: Callable[..., Task]) -> Callable[..., Task]:
    """inspect's `@task`, under the name `cupid/<function>` however the package is installed. inspect prefixes a task
    with its import package where it finds the package installed: in site-packages (a wheel), or as an editable install
    of a distribution named like the package. The distribution is `cupid-eval`, so a checkout's editable install is
    neither, and would register a bare `inference` that `inspect eval cupid/inference` does not find: there the
    prefix is given by name."""
    registered = task(func)
    if registry_info(registered).name.startswith(f"{PREFIX}/"):
        return registered
    return task(name=f"{PREFIX}/{func.__name__}")(func)


@_cupid_task
def inference(
    data: str = "sample",
    setting: str = "standard",
    types: str | list[str] | None = None,
    limit: int | None = None,
    decomposer: str | None = None,
    matcher: str | None = None,
    summarizer: str | None = None,
    endpoints: str = DEFAULT_FILE,
    structured_output: bool = False,
    constrain: bool = False,
    max_tokens: int | None = None,
    cache: str | None = DEFAULT_CACHE,
    no_cache: bool = False,
) -> Task:
    """CUPID task 1: infer the user's preference from the prior sessions; scored by P/R/F1 of its checklist
    against the ground truth's (micro: the published aggregate).

    Args:
        data: `sample`, a local .jsonl/.json/.parquet file or directory, or a Hub id (kixlab/CUPID).
        setting: standard, oracle or summary (needs `summarizer`).
        types: only these instance types (consistent, contrastive, changing; a list or `a,b`).
        limit: only the first N instances.
        decomposer: endpoint name, running `cupid serve` profile, or base URL (default: the shipped run's).
        matcher: the same, for PrefMatcher (default: the shipped run's).
        summarizer: the same, for the summary setting.
        endpoints: the endpoints file the names are looked up in.
        structured_output: judges given as base URLs are vLLM servers that enforce answer formats.
        constrain: hold the candidate's answers to the task's format (vLLM's `structured_outputs`; recorded).
        max_tokens: the candidate's answer cap.
        cache: the request cache: a SQLite file, or `default` (the one `cupid eval run` uses).
        no_cache: neither read nor write a request cache (a run config's `cache: null`).
    """
    roles = {"decomposer": decomposer, "matcher": matcher, "summarizer": summarizer}
    return _task(
        INFERENCE,
        data,
        setting,
        types,
        limit,
        roles,
        endpoints,
        structured_output,
        constrain,
        max_tokens,
        cache,
        no_cache,
    )


@_cupid_task
def generation(
    data: str = "sample",
    setting: str = "standard",
    types: str | list[str] | None = None,
    limit: int | None = None,
    judge: str | None = None,
    summarizer: str | None = None,
    endpoints: str = DEFAULT_FILE,
    structured_output: bool = False,
    max_tokens: int | None = None,
    cache: str | None = DEFAULT_CACHE,
    no_cache: bool = False,
) -> Task:
    """CUPID task 2: answer the current request as the user would prefer; scored 1-10 by the judge against
    the ground-truth preference and its checklist.

    Args:
        data: `sample`, a local .jsonl/.json/.parquet file or directory, or a Hub id (kixlab/CUPID).
        setting: standard, oracle, oracle-preference or summary (needs `summarizer`).
        types: only these instance types (consistent, contrastive, changing; a list or `a,b`).
        limit: only the first N instances.
        judge: endpoint name, running `cupid serve` profile, or base URL (default: the shipped run's).
        summarizer: the same, for the summary setting.
        endpoints: the endpoints file the names are looked up in.
        structured_output: judges given as base URLs are vLLM servers that enforce answer formats.
        max_tokens: the candidate's answer cap.
        cache: the request cache: a SQLite file, or `default` (the one `cupid eval run` uses).
        no_cache: neither read nor write a request cache (a run config's `cache: null`).
    """
    roles = {"judge": judge, "summarizer": summarizer}
    return _task(
        GENERATION, data, setting, types, limit, roles, endpoints, structured_output, False, max_tokens, cache, no_cache
    )


def _task(
    spec: TaskSpec,
    data: str,
    setting: str,
    types: str | list[str] | None,
    limit: int | None,
    roles: dict[str, str | None],
    endpoints_file: str,
    structured_output: bool,
    constrain: bool,
    max_tokens: int | None,
    cache: str | None,
    no_cache: bool,
) -> Task:
    if setting not in spec.settings:
        raise ConfigError(f"cupid/{spec.name}: no setting '{setting}' (one of {', '.join(spec.settings)})")
    types = [types] if isinstance(types, str) else types
    if unknown := sorted(set(types or ()) - set(INSTANCE_TYPES)):
        raise ConfigError(
            f"cupid/{spec.name}: no instance type {', '.join(unknown)} (types: {', '.join(INSTANCE_TYPES)})"
        )
    wanted = [*spec.roles, *extra_roles([setting])]
    judges = TaskJudges.bind(
        spec,
        {r: roles[r] for r in wanted},
        endpoints_file,
        structured_output,
        None if no_cache else (str(path) if (path := cache_path(cache)) else None),
    )
    dataset = cupid_data.load(data).filter(types, limit)
    answer_format = spec.answer_format(max_tokens) if constrain and spec.answer_format else {}
    meta = {
        "task": spec.name,
        "setting": setting,
        "data": cupid_data.named(data),  # the run's identity, as a CLI run records it
        "source": dataset.source,  # where its rows were read: the summary's `data`, as in a CLI run
        "roles": {role: f"{judges.names[role]} ({e.model})" for role, e in judges.endpoints.items()},
        "models": {role: e.model for role, e in judges.endpoints.items()},
        "matcher_prompt": matcher_dialect(judges.endpoints["matcher"]) if "matcher" in judges.endpoints else None,
        "candidate_constrained": [spec.name] if answer_format else [],
        "prompts": prompts.versions(*spec.prompts, *extra_prompts([setting])),
        "n_instances": len(dataset.instances),
        "invalid_rows": [str(b) for b in dataset.bad_rows],
    }
    instances = {i.key: i for i in dataset.instances}
    return Task(
        dataset=MemoryDataset(
            [_sample(spec, i, setting) for i in dataset.instances], name=f"cupid-{spec.name}", location=dataset.source
        ),
        solver=candidate_answer(spec, judges, instances),
        scorer=cupid_scorer(spec, judges, instances),
        metrics=[cupid_figures()],
        config=GenerateConfig(
            temperature=0.0, max_tokens=max_tokens, extra_body=answer_format or None
        ),  # as the runner asks
        metadata={METADATA_KEY: meta},
    )


def _sample(spec: TaskSpec, instance: Instance, setting: str) -> Sample:
    # a log built from answers (the summary setting's) is the solver's
    log = "" if SETTING_SPECS[setting].built_by else plain_log(instance, setting)
    unit = {
        "key": instance.key,
        "persona_id": instance.persona_id,
        "instance_type": instance.instance_type,
        "setting": setting,
    }
    return Sample(id=instance.key, input=_messages(spec.messages(log, instance, setting)), metadata=unit)


def _messages(messages: list[dict[str, str]]) -> list[ChatMessage]:
    kinds = {"system": ChatMessageSystem, "user": ChatMessageUser, "assistant": ChatMessageAssistant}
    return [kinds[m["role"]](content=m["content"]) for m in messages]


@dataclass
class TaskJudges:
    """The judge endpoints of one task (its scorer's roles, and the summarizer in the summary setting), and their
    client and the task's scorer (`judges.open_judges`), opened on first use in the eval's event loop (an aiohttp
    session belongs to one loop) and closed when inspect's run ends."""

    spec: TaskSpec
    endpoints: dict[str, Endpoint]  # by role
    names: dict[str, str]  # by role: the name or URL given
    cache: str | None
    _opened: PerLoop[Judging] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._opened = per_loop(lambda: open_judges(self.spec, self.endpoints, self.cache))

    @classmethod
    def bind(
        cls,
        spec: TaskSpec,
        roles: dict[str, str | None],
        endpoints_file: str,
        structured_output: bool,
        cache: str | None,
    ) -> TaskJudges:
        from cupid.serving.registry import resolve  # the one resolver: a name, a running profile, or a base URL
        from cupid.serving.servers.lifecycle import live_endpoints

        defaults = read_yaml(DEFAULT_RUN)
        names = {role: given or defaults.get(role) for role, given in roles.items()}
        bound = {}
        for role, name in names.items():
            if name is None:
                raise ConfigError(f"the {role} role needs an endpoint: -T {role}=NAME|URL")
            url = name.startswith(URL_SCHEMES)
            bound[role] = resolve(
                name,
                endpoints_file=endpoints_file,
                started=live_endpoints,
                **({"structured_output": True} if url and structured_output else {}),  # type: ignore[arg-type]
            )
        return cls(spec, bound, names, cache)

    async def opened(self) -> Judging:
        """This loop's client and the task's scorer on it; the run's end closes them (`CloseJudges`)."""
        _OPEN[id(self)] = self
        return await self._opened.get()

    async def aclose(self) -> None:
        await self._opened.aclose()


_OPEN: dict[int, TaskJudges] = {}  # the judges opened in this run, each once


@hooks(name="cupid_judges", description="closes the CUPID judges' connections and request cache when a run ends")
class CloseJudges(Hooks):
    async def on_run_end(self, data: RunEnd) -> None:
        while _OPEN:
            await _OPEN.popitem()[1].aclose()


@solver
def candidate_answer(spec: TaskSpec, judges: TaskJudges, instances: dict[str, Instance]) -> Solver:
    """inspect's model answers the sample's prompt. In the summary setting the prompt is built first, from
    the summarizer's summaries of the prior sessions. A summary or a model call that fails ends the sample
    with its stage and reason, as the runner records them; the scorer reports it as a failed unit."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        instance = instances[state.metadata["key"]]
        try:
            setting = state.metadata["setting"]
            if (role := SETTING_SPECS[setting].built_by) is not None:
                log = await History((await judges.opened())[0], role).log(instance, setting)
                state.messages = _messages(spec.messages(log, instance, setting))
            return await generate(state)
        except StageFailed as e:
            state.metadata["error"] = e.error.model_dump()
        except Exception as e:  # noqa: BLE001 (the provider's error, whichever it is: the candidate gave no answer)
            state.metadata["error"] = _no_answer(spec, e).model_dump()
        state.completed = True
        return state

    return solve


def _no_answer(spec: TaskSpec, error: Exception) -> StageError:
    """The runner's reason for a candidate that gave no answer: from the provider's HTTP status and message
    where inspect kept them (`ModelGenerateError`), else `request_failed`."""
    status, message = getattr(error, "status_code", None), getattr(error, "provider_message", None) or str(error)
    reason = classify(status, message).reason if status else "request_failed"
    return StageError(stage=spec.candidate_stage, reason=reason, detail=message[:2000])


@scorer(metrics=[])
def cupid_scorer(spec: TaskSpec, judges: TaskJudges, instances: dict[str, Instance]) -> Scorer:
    """The project's scorer on the candidate's answer: P/R/F1 (inference) or the judge's score (generation)."""

    async def score(state: TaskState, target: Target) -> Score:
        instance = instances[state.metadata["key"]]
        unit = unit_record(spec, instance, state.metadata["setting"])
        if "error" in state.metadata:
            unit.error = StageError(**state.metadata["error"])
        else:
            unit = await answered(unit, instance, state.output.completion, (await judges.opened())[1])
        return to_score(unit)

    return score


def to_score(record: UnitRecord) -> Score:
    """A unit record as inspect's score; its metadata is the record itself."""
    metadata = record.model_dump(mode="json", exclude_none=True)
    if not record.scored:
        error = record.error or StageError(stage="?", reason="unknown", detail="")
        return Score.unscored(
            reason=f"{error.stage}: {error.reason}",
            answer=record.candidate_answer,
            explanation=error.detail,
            metadata=metadata,
        )
    if record.task == INFERENCE.name:
        assert record.scores is not None, "a scored inference record has P/R/F1"
        return Score(
            value=record.scores.as_dict(),
            answer=record.inferred_preference,
            explanation=_matches(record),
            metadata=metadata,
        )
    score = record.score  # scored: it has one
    return Score(  # type: ignore[arg-type]
        value=score, answer=record.candidate_answer, explanation=record.judge_answer, metadata=metadata
    )


def _matches(record: Scoring) -> str:
    lines = [f"Inferred preference: {record.inferred_preference}"]
    for title, items in (
        ("Inferred checklist against the ground-truth preference", record.infer_to_gt),
        ("Ground-truth checklist against the inferred preference", record.gt_to_infer),
    ):
        lines += ["", f"{title}:"] + [f"{m.index}. {m.entry} [{m.label}]" for m in items or []]
    return "\n".join(lines)


def record_of(score: Score) -> UnitRecord:
    return UnitRecord.model_validate(score.metadata or {})


@metric
def cupid_figures() -> Metric:
    """The task's own figures over the scored samples, as `summary.json` holds them: micro and macro P/R/F1
    (inference) or the mean judge score (generation), overall and by instance type, each with its 95% interval's
    bounds (`micro_f1_low`, `micro_f1_high`; personas resampled, as the report's). Unscored samples never
    reach a metric: inspect counts them (`unscored_samples`)."""

    def compute(scores: list[SampleScore]) -> dict[str, float]:
        records = [record_of(s.score) for s in scores if s.score.metadata]
        out: dict[str, float] = {}
        for name in {r.task for r in records}:
            for group in GROUPS:
                chosen = [r for r in records if r.task == name and group in ("all", r.instance_type)]
                block = TASKS[name].figures(chosen).model_dump(exclude={"n_failed", "failed_by_stage"})
                bounds = {  # under the minimum of personas an interval has no bounds: none is published
                    f"{metric}_{end}": bound
                    for metric, iv in TASKS[name].intervals(chosen).items()
                    for end, bound in (("low", iv.low), ("high", iv.high))
                    if bound is not None
                }
                out.update(figures(None if group == "all" else group, {**block, **bounds}))
        return out

    return compute
