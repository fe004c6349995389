"""The Python API: PrefMatcher as a judge you call from your own code, and the data it is used on.

Every entry point has a blocking form and an `a`-prefixed async form. The blocking form works where an
event loop is already running (a notebook, an async server): it then runs its requests on a private
loop in a worker thread, since the running loop cannot be blocked on. The answers are the ones `cupid
eval run` computes for the same inputs: the same scorer, the same requests, and so the same cache keys.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from pathlib import Path
from typing import Any, ParamSpec, Self, TypeVar

from rich.console import Console

from cupid.common.aio import blocking
from cupid.common.config import (
    ConfigError,
    Tracker,  # noqa: F401 (the API)
)
from cupid.eval.benchmark import data as cupid_data
from cupid.eval.benchmark.data import Dataset  # noqa: F401 (the API)
from cupid.eval.benchmark.inference import INFERENCE, InferenceScorer, matcher_dialect  # noqa: F401 (the API)
from cupid.eval.benchmark.judges import open_judges  # noqa: F401 (the API)
from cupid.eval.benchmark.records import Labels, Scoring, StageError  # noqa: F401 (the API)
from cupid.eval.benchmark.runner import InstanceType, RunConfig, RunResult  # noqa: F401 (the API)
from cupid.eval.benchmark.settings import Setting  # noqa: F401 (the API)
from cupid.eval.benchmark.stages import StageFailed  # noqa: F401 (the API)
from cupid.eval.benchmark.summary import Summary  # noqa: F401 (the API)
from cupid.eval.integrations.reward import format_reward, reward, reward_dataset  # noqa: F401 (the API)
from cupid.eval.results.compare import Comparison, compare  # noqa: F401 (the API: cupid/__init__.py's __all__)
from cupid.eval.workflows.logged_run import arun_and_log  # the run, then its tracker run when `track=` asks
from cupid.matcher.parse import MatchItem  # noqa: F401 (the API)
from cupid.serving.cache import cache_path
from cupid.serving.client import per_loop
from cupid.serving.endpoint import Endpoint
from cupid.serving.executors import Executor  # noqa: F401 (the API)
from cupid.serving.fleet.on_demand import ServedModel
from cupid.serving.registry import DEFAULT_FILE, URL_SCHEMES, EndpointLike, resolve
from cupid.serving.servers.lifecycle import live_endpoints
from cupid.serving.servers.profiles import DEFAULT_DIR as PROFILES_DIR

T = TypeVar("T")
P = ParamSpec("P")


def endpoint(
    spec: EndpointLike, *, model: str | None = None, endpoints_file: str | Path = DEFAULT_FILE, **fields: Any
) -> Endpoint:
    """An endpoint from a name (an entry of the endpoints file, or a server running under `cupid serve up`: its
    profile's name), a base URL (`model`: default the one model the server lists) or an `Endpoint`; any other
    `Endpoint` field as a keyword (`structured_output=True`, ...)."""
    return resolve(spec, model=model, endpoints_file=endpoints_file, started=live_endpoints, **fields)


class PrefMatcher:
    """PrefMatcher, the CUPID preference-match judge, as an object to call.

    ```python
    with cupid.PrefMatcher("http://localhost:8000/v1") as pm:   # or an Endpoint, or "prefmatcher"
        pm.labels("Prefers concise answers", ["Is the answer short?"])   # [MatchItem(index=1, entry=..., label=...)]
    async with cupid.PrefMatcher("prefmatcher") as pm:         # the async forms: connections live until the end
        await pm.alabels_batch(pairs)
    ```

    A blocking call opens and closes its own connections. The async forms keep theirs open on their event loop
    for the next call, until `await aclose()` (or the end of `async with`), at the latest until the loop
    finalizes its async generators (`asyncio.run` does before it returns): a script that never closes leaves
    nothing open. `close()` (or the end of `with`) closes what they left on loops not running now.

    The matcher's prompt dialect and structured output come from the endpoint (a base URL: from the
    model's name and the fields passed). `score` also needs a `decomposer` to turn an inferred preference
    into its checklist. With `cache` (a SQLite file), answered requests are never sent twice and are shared
    with `cupid eval run` runs on the same file. Requests in flight are bounded by each endpoint's
    `max_concurrency` (or `concurrency`), so the batch forms keep hundreds in flight on a vLLM server.
    """

    def __init__(
        self,
        matcher: EndpointLike = "prefmatcher",
        *,
        decomposer: EndpointLike | None = None,
        cache: str | Path | None = None,
        concurrency: int | None = None,
        **endpoint_fields: Any,
    ):
        self.endpoint = endpoint(matcher, **endpoint_fields)
        self.decomposer = endpoint(decomposer) if decomposer is not None else None
        self.dialect = matcher_dialect(self.endpoint)
        self.cache_path = cache_path(cache)  # the one cache rule: a path, "default", or None (none)
        self.concurrency = concurrency
        # per event loop: its client and scorer (a server down fails the first call that must be sent to it, by name)
        self._opened = per_loop(
            lambda: open_judges(INFERENCE, self._endpoints(), self.cache_path, self.concurrency, probe=True)
        )

    def __repr__(self) -> str:
        return f"PrefMatcher({self.endpoint.model!r} at {self.endpoint.url}, dialect={self.dialect!r})"

    def _endpoints(self) -> dict[str, Endpoint]:
        return {"matcher": self.endpoint, **({"decomposer": self.decomposer} if self.decomposer else {})}

    async def _scorer(self) -> InferenceScorer:
        scorer = (await self._opened.get())[1]
        assert isinstance(scorer, InferenceScorer)  # INFERENCE's
        return scorer

    async def aclose(self) -> None:
        """Close this event loop's connections and cache (again: nothing to do)."""
        await self._opened.aclose()

    def close(self) -> None:
        """Close what async calls left open on event loops not running now (again: nothing to do). On a running
        loop, `await pm.aclose()` instead (or `async with`): its connections can only be closed on it."""
        try:
            self._opened.close()
        except RuntimeError:
            raise RuntimeError(
                "PrefMatcher.close() while its event loop runs: use `await pm.aclose()` or `async with`"
            ) from None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _blocking(self, make: Callable[[], Awaitable[T]]) -> T:
        async def once() -> T:
            try:
                return await make()
            finally:
                await self.aclose()

        return blocking(once)

    # labels: the matcher alone
    async def alabels(self, preference: str, checklist: Sequence[str]) -> list[MatchItem]:
        """Each checklist item labelled against the preference (`Fully Covered`, `Partially Covered`,
        `Not Covered`), in checklist order. Raises `StageFailed` when the request fails or the answer
        does not parse (its `.error` says which, with the raw answer)."""
        matched = await (await self._scorer()).match("match", preference, list(checklist))
        return matched

    async def alabels_batch(self, pairs: Iterable[tuple[str, Sequence[str]]]) -> list[Labels]:
        """`alabels` for many (preference, checklist) pairs at once, in order. As `ascore_batch`, an item never raises:
        each is `status="scored"` with its `items`, or `status="failed"` with its `error`."""

        async def one(preference: str, checklist: Sequence[str]) -> Labels:
            try:
                return Labels(status="scored", items=await self.alabels(preference, checklist))
            except StageFailed as e:
                return Labels(status="failed", error=e.error)

        return list(await asyncio.gather(*(one(p, c) for p, c in pairs)))

    def labels(self, preference: str, checklist: Sequence[str]) -> list[MatchItem]:
        return self._blocking(lambda: self.alabels(preference, checklist))

    def labels_batch(self, pairs: Iterable[tuple[str, Sequence[str]]]) -> list[Labels]:
        pairs = list(pairs)
        return self._blocking(lambda: self.alabels_batch(pairs))

    # scores: decomposer + matcher both directions, as the inference task scores an answer
    async def ascore(self, inferred: str, preference: str, checklist: Sequence[str]) -> Scoring:
        """An inferred preference against the ground truth (preference and checklist): the inferred
        checklist, both match directions, counts and P/R/F1. A failed stage gives `status="failed"` and
        its `error`, with what came before it kept; it is never a zero score."""
        if self.decomposer is None:
            raise ConfigError("PrefMatcher.score needs a decomposer: PrefMatcher(..., decomposer=ENDPOINT)")
        return await (await self._scorer()).score_preference(inferred, preference, list(checklist))

    async def ascore_batch(self, triples: Iterable[tuple[str, str, Sequence[str]]]) -> list[Scoring]:
        """`ascore` for many (inferred, preference, checklist) triples at once, in order (a failed one is
        `status="failed"` with its `error`, as in `alabels_batch`)."""
        return list(await asyncio.gather(*(self.ascore(i, p, c) for i, p, c in triples)))

    def score(self, inferred: str, preference: str, checklist: Sequence[str]) -> Scoring:
        return self._blocking(lambda: self.ascore(inferred, preference, checklist))

    def score_batch(self, triples: Iterable[tuple[str, str, Sequence[str]]]) -> list[Scoring]:
        triples = list(triples)
        return self._blocking(lambda: self.ascore_batch(triples))


def load_dataset(
    source: str | Path = "sample", *, types: Sequence[str] | None = None, limit: int | None = None
) -> Dataset:
    """CUPID instances from the same sources as `--data`: `sample` (bundled), a local .jsonl/.json/.parquet
    file or directory, or a Hub id (`kixlab/CUPID`). Rows that do not fit the schema are in `.bad_rows`,
    each naming its file and row, never dropped silently."""
    return cupid_data.load(source).filter(types, limit)


async def aevaluate(
    candidate: EndpointLike | ServedModel,
    *,
    matcher: EndpointLike | None = None,
    decomposer: EndpointLike | None = None,
    judge: EndpointLike | None = None,
    summarizer: EndpointLike | None = None,
    reference: EndpointLike | None = None,
    data: str = "sample",
    tasks: Sequence[str] = (INFERENCE.name,),
    settings: Sequence[Setting] = ("standard",),
    out: str | Path | None = None,
    cache: str | Path | None = None,
    endpoints_file: str | Path = DEFAULT_FILE,
    progress: bool = True,
    types: Sequence[InstanceType] = (),
    limit: int | None = None,
    concurrency: int | None = None,
    executor: Executor = "http",
    serve: dict[str, dict[str, Any]] | Sequence[str] | None = None,
    refresh: bool = False,
    profiles: str | Path = PROFILES_DIR,
    track: Tracker | None = None,
    **misspelt: Any,
) -> RunResult:
    """CUPID on one candidate, as `cupid eval run` runs it, returning what it computed.

    Each role is a name (an entry of `endpoints_file`, or a server running under `cupid serve up`), an
    `Endpoint`, or a base URL; the candidate may also be a `ServedModel` the run serves and stops. Nothing
    is written unless asked: `out` is a run directory (resumable: a rerun keeps its scored units), `cache`
    a request-cache file. The other arguments are the run config's fields of the same names (`cupid eval run
    --help`; `track`: "mlflow" or "wandb" logs the finished run); the progress bar goes to stderr. An endpoint that
    does not answer fails the call at once, naming its role and URL; a keyword that is none of these is refused by
    name, with the closest one."""
    if misspelt:
        raise TypeError(_unknown_keywords("evaluate", misspelt, aevaluate))
    names, bound = _bound_roles(
        {
            "candidate": candidate,
            "matcher": matcher,
            "decomposer": decomposer,
            "judge": judge,
            "summarizer": summarizer,
            "reference": reference,
        }
    )
    cfg = RunConfig(
        **names,
        data=str(data),
        tasks=list(tasks),
        settings=list(settings),
        endpoints=str(endpoints_file),
        out=str(out) if out is not None else None,
        cache=str(cache) if cache is not None else None,  # None: no cache, as everywhere
        types=list(types),
        limit=limit,
        concurrency=concurrency,
        executor=executor,
        serve=serve if serve is not None else {},  # type: ignore[arg-type]  # names: the field's validator
        refresh=refresh,
        profiles=str(profiles),
        track=track,
    )
    return await arun_and_log(cfg, console=Console(stderr=True, quiet=not progress), endpoints=bound)


def _bound_roles(roles: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Endpoint]]:
    """The roles as the run config names them, and the endpoints given in place of a name: an `Endpoint` or a base
    URL becomes an endpoint named for its role, since the config holds names and the run looks them up."""
    names: dict[str, Any] = {}
    bound: dict[str, Endpoint] = {}
    for role, value in roles.items():
        if isinstance(value, Endpoint) or (isinstance(value, str) and value.startswith(URL_SCHEMES)):
            try:
                bound[role] = endpoint(value)
            except ConfigError as e:  # a base URL asked for its model: which role's it is
                raise ConfigError(f"{role} '{value}': {e}") from None
            names[role] = role
        else:
            names[role] = value  # a name, a served model, or None
    return names, bound


def _unknown_keywords(name: str, given: dict[str, Any], func: Callable[..., Any]) -> str:
    """`name() got an unexpected keyword argument 'x'; did you mean 'y'?`, for each keyword `func` does not take."""
    import difflib
    import inspect

    known = [p for p, v in inspect.signature(func).parameters.items() if v.kind is inspect.Parameter.KEYWORD_ONLY]
    said = []
    for key in given:
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
        said.append(
            f"{name}() got an unexpected keyword argument {key!r}" + (f"; did you mean {close[0]!r}?" if close else "")
        )
    return "; ".join(said)


def _blocking_form(afunc: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """The blocking form of an async entry point, with its signature (for type checkers and `help()`)."""

    @functools.wraps(afunc)
    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        return blocking(lambda: afunc(*args, **kwargs))

    call.__doc__ = f"`{afunc.__name__}` from blocking code, inside a running event loop too (a notebook)."
    return call


evaluate = _blocking_form(aevaluate)
evaluate.__name__ = evaluate.__qualname__ = "evaluate"
