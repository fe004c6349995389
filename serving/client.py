"""Batched async chat requests to OpenAI-compatible endpoints, through the request cache.

Callers fire all their requests at once; each endpoint's semaphore bounds what is in flight (vLLM
batches whatever is in flight), retries back off on 429/5xx/connection errors, identical requests
in flight at the same time are sent once, and answered requests are read from the cache.

What carries one request to its endpoint is the client's transport (as httpx's): HTTP unless another is given
(`Transport`; `MockTransport` answers from a function, for tests and a backend inside this process), with
everything above it (cache, one send for identical requests, bounds, retries, classification) the same.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, Self, TypeVar

import aiohttp
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from cupid.common.aio import PerLoop
from cupid.common.errors import failure_line
from cupid.serving.cache import Cache, Cached
from cupid.serving.endpoint import Endpoint, bearer
from cupid.serving.registry import EndpointDown, Hint, Problem, down_message, unreachable

log = logging.getLogger(__name__)  # each retry, at INFO (`cupid -v` shows it)

CONTEXT_MARKERS = ("context length", "context_length", "maximum context", "too many tokens", "prompt is too long")


class RequestFailed(Exception):
    """A request that has no usable answer; `reason` is a short code that summaries count by."""

    def __init__(self, reason: str, detail: str, retryable: bool = False):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.retryable = retryable


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[dict[str, str]]
    params: dict[str, Any] = field(default_factory=dict)
    revision: str | None = None  # the weights' fingerprint (`Endpoint.revision`): in the key, never sent

    def body(self) -> dict[str, Any]:
        return {"model": self.model, "messages": self.messages, **self.params}

    def key(self) -> str:
        keyed = self.body() | ({"revision": self.revision} if self.revision else {})  # without one: the old keys
        canonical = json.dumps(keyed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Answer(Cached):
    """A model's answer as the cache keeps it, and whether the cache gave it."""

    cached: bool


@dataclass
class Stats:
    sent: int = 0
    cached: int = 0
    failed: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def done(self) -> int:
        return self.sent + self.cached

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return f"requests: {self.sent} sent, {self.cached} cached, {self.failed} failed, {self.sent / elapsed:.1f}/s"


def classify(status: int, text: str) -> RequestFailed:
    """An HTTP error as the reason a run counts it by (also for a candidate that inspect-ai asked)."""
    text = text[:2000]
    if status == 429:
        return RequestFailed("rate_limited", text, retryable=True)
    if status >= 500:
        return RequestFailed(f"http_{status}", text, retryable=True)
    if any(marker in text.lower() for marker in CONTEXT_MARKERS):
        return RequestFailed("context_length_exceeded", text)
    return RequestFailed(f"http_{status}", text)


@dataclass(frozen=True)
class Response:
    """What came back for one request: the HTTP status and the body (an OpenAI chat completion when 200)."""

    status: int
    text: str

    @classmethod
    def completion(cls, content: str, finish_reason: str = "stop", usage: dict[str, Any] | None = None) -> Response:
        """A 200 answer carrying `content`, as an OpenAI-compatible server writes it."""
        body = {"choices": [{"message": {"content": content}, "finish_reason": finish_reason}], "usage": usage}
        return cls(200, json.dumps(body))


class Transport(Protocol):
    """One attempt at one request: its endpoint's answer, or a `RequestFailed` where none came (a connection,
    a timeout). The client keeps the rest: the cache, one send for identical requests, the endpoint's concurrency,
    retries, and reading the answer (`answer_of`)."""

    async def __call__(self, name: str, endpoint: Endpoint, request: ChatRequest) -> Response: ...


Handler = Callable[[str, ChatRequest], "Response | Awaitable[Response]"]


class MockTransport:
    """A transport that asks a function (`handler(endpoint name, request)`, plain or async) instead of a server, as
    httpx's `MockTransport`: tests see what a client sends and choose what comes back, rate limits (429) and
    garbled bodies included; a backend inside this process answers the same way."""

    def __init__(self, handler: Handler):
        self.handler = handler

    async def __call__(self, name: str, endpoint: Endpoint, request: ChatRequest) -> Response:
        found = self.handler(name, request)
        return await found if inspect.isawaitable(found) else found


def answer_of(response: Response, latency: float) -> Answer:
    """The answer a response carries, or the reason it carries none (`classify`; a body that is not a completion:
    bad_response)."""
    if response.status != 200:
        raise classify(response.status, response.text)
    try:
        data = json.loads(response.text)
        choice = data["choices"][0]
        content = choice["message"].get("content") or ""
    except (ValueError, KeyError, IndexError, TypeError):
        raise RequestFailed("bad_response", response.text[:2000]) from None
    return Answer(content, choice.get("finish_reason"), data.get("usage"), latency, cached=False)


class ManagedServer(Protocol):
    """A server a run brings, as its requests see it (`serving.fleet.Server`, or `AdapterOnServer`: a LoRA candidate
    in a judge's server): started on the first request that needs it, restarted when it stops answering."""

    @property
    def generation(self) -> int: ...  # restarts so far: a request that failed before one is sent again

    @property
    def died(self) -> bool: ...  # stopped answering and did not come back

    async def wait_ready(self) -> None: ...

    async def revived(self, seen: int) -> bool: ...

    def gone(self) -> bool: ...


class Client:
    def __init__(
        self,
        endpoints: dict[str, Endpoint],
        cache: Cache | None = None,
        *,
        refresh: bool = False,
        concurrency: int | None = None,
        servers: dict[str, ManagedServer] | None = None,
        roles: dict[str, str] | None = None,
        down_hint: Hint | None = None,
        transport: Transport | None = None,
    ):
        self.endpoints = endpoints
        self.cache = cache
        self.refresh = refresh
        self.concurrency = concurrency
        self.stats = Stats()
        self._http: dict[str, aiohttp.ClientSession] = {}
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._in_flight: dict[str, asyncio.Future[Answer]] = {}
        self.servers = servers or {}  # endpoint name -> the server a run brings for it, started on the first cache miss
        self._starting: dict[str, asyncio.Future[None]] = {}
        # With `roles` (role -> endpoint name), an endpoint is asked once, before the first request that must be sent
        # to it, whether it answers; one that does not stops the run (`EndpointDown`) instead of failing each unit.
        # A run answered from the cache asks nothing; `down_hint` says what to do then.
        self.roles, self.down_hint = roles, down_hint
        self._answering: dict[str, asyncio.Future[dict[str, Problem]]] = {}
        # what carries a request (`Transport`); None: HTTP (`_http_post`: a bound method kept here would tie the
        # client to itself, and a client dropped unclosed would then wait for the garbage collector)
        self.transport = transport

    def limit(self, name: str) -> int:
        return self.concurrency or self.endpoints[name].max_concurrency

    def request(self, name: str, messages: list[dict[str, str]], **params: Any) -> ChatRequest:
        """The request as the endpoint receives it: its model, its answer cap and its extra fields."""
        endpoint = self.endpoints[name]
        merged: dict[str, Any] = {"temperature": 0.0}
        if endpoint.max_tokens is not None:
            merged["max_tokens"] = endpoint.max_tokens
        merged.update(endpoint.extra_body)
        merged.update({k: v for k, v in params.items() if v is not None})
        return ChatRequest(endpoint.model, messages, merged, endpoint.revision)

    async def chat(self, name: str, messages: list[dict[str, str]], **params: Any) -> Answer:
        return await self.send(name, self.request(name, messages, **params))

    async def send(self, name: str, request: ChatRequest) -> Answer:
        key = request.key()
        if self.cache is not None and not self.refresh:
            hit = self.cache.get(key)
            if hit is not None:
                self.stats.cached += 1
                return Answer(hit.content, hit.finish_reason, hit.usage, hit.latency_s, cached=True)
        if key in self._in_flight:
            return await asyncio.shield(self._in_flight[key])
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._in_flight[key] = future
        try:
            await self._answers(name)
            await self._server_up(name)
            answer = await self._send_with_retries(name, request)
        except BaseException as e:
            future.set_exception(e)
            future.exception()  # mark retrieved: waiters, if any, get it through shield
            self.stats.failed += 1
            raise
        finally:
            del self._in_flight[key]
        future.set_result(answer)
        self.stats.sent += 1
        if self.cache is not None:
            self.cache.put(key, request.model, request.body(), answer)
        return answer

    async def _answers(self, name: str) -> None:
        """Where asked (`roles`), the endpoint answered before its first request is sent (once; a server this run
        brings starts on that request instead)."""
        if self.roles is None or name in self.servers:
            return
        if name not in self._answering:
            probe = asyncio.to_thread(unreachable, {name: self.endpoints[name]})
            self._answering[name] = asyncio.ensure_future(probe)
        if down := await asyncio.shield(self._answering[name]):
            raise EndpointDown(down_message(down, self.endpoints, self.roles, self.down_hint))

    async def _server_up(self, name: str) -> None:
        """Wait for the endpoint's server where this run brings it (one start for all its requests)."""
        server = self.servers.get(name)
        if server is None:
            return
        if name not in self._starting:
            self._starting[name] = asyncio.ensure_future(server.wait_ready())
        try:
            await asyncio.shield(self._starting[name])
        except Exception as e:  # noqa: BLE001 (whatever stopped the start, the request fails as the server's)
            raise RequestFailed("server_died" if server.died else "server_not_started", failure_line(e)) from None

    async def _send_with_retries(self, name: str, request: ChatRequest) -> Answer:
        """The endpoint's retries; then, where this run brought the server and the failure may be the server's
        (no connection, a timeout, a 5xx), the server is checked and restarted if it died, and the request sent
        again."""
        server = self.servers.get(name)
        seen = server.generation if server is not None else 0
        try:
            return await self._attempts(name, request, server)
        except RequestFailed as e:
            if server is None or not (e.reason in ("connection", "timeout") or e.reason.startswith("http_5")):
                raise
            try:
                revived = await server.revived(seen)
            except Exception as died:  # noqa: BLE001 (whatever stopped the revival, the server died)
                raise RequestFailed("server_died", failure_line(died)) from None
            if not revived:
                raise
        return await self._attempts(name, request, server)

    async def _attempts(self, name: str, request: ChatRequest, server: ManagedServer | None = None) -> Answer:
        endpoint = self.endpoints[name]

        def worth_retrying(e: BaseException) -> bool:
            if not (isinstance(e, RequestFailed) and e.retryable):
                return False
            return not (server is not None and e.reason == "connection" and server.gone())  # no waiting on the dead

        retrying = AsyncRetrying(
            stop=stop_after_attempt(endpoint.max_retries + 1),
            wait=wait_exponential_jitter(initial=1, max=30),
            retry=retry_if_exception(worth_retrying),
            before_sleep=lambda state: log.info(
                "%s: attempt %d failed (%s); retrying in %.1f s",
                name,
                state.attempt_number,
                state.outcome.exception() if state.outcome else "?",
                state.next_action.sleep if state.next_action else 0.0,
            ),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await self._post(name, request)
        raise AssertionError("unreachable")

    async def _post(self, name: str, request: ChatRequest) -> Answer:
        endpoint = self.endpoints[name]
        async with self._slot(name):
            started = time.perf_counter()
            response = await (self.transport or self._http_post)(name, endpoint, request)
            latency = time.perf_counter() - started
        return answer_of(response, latency)

    async def _http_post(self, name: str, endpoint: Endpoint, request: ChatRequest) -> Response:
        """The default transport: a POST to the endpoint's /chat/completions, on its own session."""
        http = self._client(name)
        try:
            async with http.post(endpoint.url + "/chat/completions", json=request.body()) as response:
                return Response(response.status, await response.text())
        except TimeoutError:
            raise RequestFailed("timeout", f"no answer after {endpoint.timeout_s}s", True) from None
        except aiohttp.ClientError as e:
            raise RequestFailed("connection", f"{type(e).__name__}: {e} ({endpoint.url})", True) from None

    def _slot(self, name: str) -> asyncio.Semaphore:
        if name not in self._slots:
            self._slots[name] = asyncio.Semaphore(self.limit(name))
        return self._slots[name]

    def _client(self, name: str) -> aiohttp.ClientSession:
        """One session per endpoint. aiohttp, because httpx's pool costs grow with the connections open."""
        if name not in self._http:
            endpoint = self.endpoints[name]
            key = endpoint.api_key()
            if endpoint.api_key_env and not key:
                raise RequestFailed("missing_api_key", f"endpoint '{name}' needs ${endpoint.api_key_env}")
            self._http[name] = aiohttp.ClientSession(
                headers=bearer(key),
                timeout=aiohttp.ClientTimeout(total=endpoint.timeout_s, connect=30.0),
                connector=aiohttp.TCPConnector(limit=self.limit(name)),
            )
        return self._http[name]

    async def aclose(self) -> None:
        for http in self._http.values():
            await http.close()
        self._http.clear()

    async def close_with_cache(self) -> None:
        """Its connections, then its cache (a client opened for a caller that owns nothing else: PrefMatcher, a
        reward)."""
        await self.aclose()
        self.close_cache()

    def close_cache(self) -> None:
        if self.cache is not None:
            self.cache.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


T = TypeVar("T")


def per_loop(open: Callable[[], tuple[Client, T]]) -> PerLoop[tuple[Client, T]]:
    """A client (and what is built on it) per event loop, closed with its cache on that loop (`common.aio.PerLoop`):
    what PrefMatcher and a reward function hold."""
    return PerLoop(open, lambda opened: opened[0].close_with_cache(), cleanup=lambda opened: opened[0].close_cache())
