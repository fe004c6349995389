"""Offline executor: the client the eval tasks use, answered by an engine inside this process.

For a box with no server running (`--executor vllm-offline`, on a GPU or on CPU with vLLM's CPU build).
`OfflineClient` is a `serving.client.Client` whose transport is a batch call instead of HTTP: requests keep their exact
bodies and cache keys, answered ones come from the same cache, identical requests in flight are
computed once, and `request()`, `send()`, `chat()`, `stats`, `endpoints` and `aclose()` behave as
they do over HTTP. A run can therefore switch executor and reuse everything already answered.

Requests that arrive while the engine is busy wait for its next batch; each batch is one blocking
engine call (`vllm.LLM.chat`) in a worker thread, so the event loop keeps answering from the cache
and writing results meanwhile. How a model is loaded (dtype, memory fraction, LoRA adapters,
batch-invariant mode) comes from the serve profile that serves its name (`configs/serve/`), so an
offline run and a served run load it alike. Endpoints on other hosts (e.g. a GPT-4o reference) are
still sent over HTTP.
"""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, Protocol
from urllib.parse import urlparse

from cupid.common.config import ConfigError
from cupid.common.errors import ServeError
from cupid.serving.cache import Cache
from cupid.serving.client import Answer, ChatRequest, Client, RequestFailed
from cupid.serving.endpoint import Endpoint
from cupid.serving.fleet import gpu_memory
from cupid.serving.fleet.gpu_memory import Plan
from cupid.serving.registry import LOCAL_HOSTS
from cupid.serving.servers import lifecycle, profiles, vllm_args
from cupid.serving.servers.engines import vllm_build, vllm_install
from cupid.serving.servers.profiles import Profile

# What an offline answer does not carry (log-probabilities, more than one choice), or what the chat API gives in
# another form than `SamplingParams` takes it (logit_bias: string token ids), among the fields both share.
NOT_OFFLINE = {"n", "logprobs", "prompt_logprobs", "logprob_token_ids", "logit_bias"}


class EngineLoadFailed(ServeError):
    """The model could not be loaded: nothing can be answered offline, so the run stops (not per request). A
    `ServeError`, as a server that did not start is: the CLI's one line and exit 1."""


class Backend(Protocol):
    def generate(self, requests: list[ChatRequest]) -> list[Answer | RequestFailed]: ...

    def close(self) -> None: ...


def _unsupported(key: str, why: str = "") -> RequestFailed:
    return RequestFailed(
        "unsupported_param", f"{key!r} cannot be honoured offline{': ' + why if why else ''}; use --executor http"
    )


@cache
def _shared_sampling_fields() -> frozenset[str]:
    """The chat request's fields `SamplingParams` takes under the same name, read from vLLM, less `NOT_OFFLINE`."""
    return frozenset(vllm_args.vllm_defaults()["sampling_fields"]) - NOT_OFFLINE


def sampling_kwargs(params: dict[str, Any]) -> dict[str, Any]:
    """A chat request's fields as `vllm.SamplingParams` keyword arguments, with structured output as the plain
    dict for `StructuredOutputsParams`. A field with no offline equivalent fails the request, never silently."""
    out: dict[str, Any] = {"max_tokens": None}  # as the server does: up to the context length
    shared = _shared_sampling_fields()
    for key, value in params.items():
        if key in ("max_tokens", "max_completion_tokens"):
            out["max_tokens"] = value
        elif key == "n":
            if value != 1:
                raise _unsupported(key, "one answer per request")
        elif key == "structured_outputs":
            out["structured_outputs"] = dict(value)
        elif key in shared:
            out[key] = value
        elif key == "response_format":
            kind = value.get("type") if isinstance(value, dict) else None
            if kind == "json_schema":
                out["structured_outputs"] = {"json": value["json_schema"]["schema"]}
            elif kind == "json_object":
                out["structured_outputs"] = {"json_object": True}
            elif kind != "text":
                raise _unsupported(key, f"type {kind!r}")
        else:
            raise _unsupported(key)
    return out


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class VllmBackend:
    """One `vllm.LLM` for a profile; its LoRA adapters answer requests that name them as `model`."""

    def __init__(self, profile: Profile):
        import vllm
        from vllm.lora.request import LoRARequest

        os.environ.update(vllm_args.engine_env(profile))  # read when the engine starts
        lifecycle.count_vllm_start(f"offline {profile.name}")
        self.llm = vllm.LLM(**vllm_args.llm_kwargs(profile))
        self.loras = {
            name: LoRARequest(name, i, path) for i, (name, path) in enumerate(profile.adapter_paths().items(), start=1)
        }

    def _params(self, request: ChatRequest):
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        kwargs = sampling_kwargs(request.params)
        if "structured_outputs" in kwargs:
            kwargs["structured_outputs"] = StructuredOutputsParams(**kwargs["structured_outputs"])
        return SamplingParams(**kwargs)

    def generate(self, requests: list[ChatRequest]) -> list[Answer | RequestFailed]:
        results: list[Answer | RequestFailed | None] = [None] * len(requests)
        todo = []
        for i, request in enumerate(requests):
            try:
                todo.append((i, request, self._params(request)))
            except RequestFailed as e:
                results[i] = e
            except (ValueError, TypeError) as e:  # vLLM's own validation of the values
                results[i] = RequestFailed("bad_request", f"{type(e).__name__}: {e}")
        if todo:
            started = time.perf_counter()
            outputs = self.llm.chat(
                [r.messages for _, r, _ in todo],  # type: ignore[arg-type]  # OpenAI chat messages, as dicts
                sampling_params=[p for _, _, p in todo],
                use_tqdm=False,
                # None: the base model
                lora_request=(  # type: ignore[misc]
                    [self.loras.get(r.model) for _, r, _ in todo] if self.loras else None
                ),
            )
            elapsed = time.perf_counter() - started
            for (i, _, _), output in zip(todo, outputs, strict=True):
                completion = output.outputs[0]
                usage = _usage(len(output.prompt_token_ids or []), len(completion.token_ids))
                results[i] = Answer(completion.text, completion.finish_reason, usage, elapsed, cached=False)
        return results  # type: ignore[return-value]

    def close(self) -> None:
        del self.llm
        gc.collect()


class TransformersBackend:
    """`generate()` of transformers in this process, batched with left padding: the CPU stand-in for vLLM.

    Greedy at temperature 0, sampling otherwise; no structured output (that needs vLLM)."""

    FIELDS: ClassVar[set[str]] = {"temperature", "top_p", "seed", "max_tokens", "max_completion_tokens"}

    def __init__(self, model_dir: str | Path, default_max_tokens: int = 256):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        eos = self.model.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos]) - {None}
        self.default_max_tokens = default_max_tokens

    def _settings(self, params: dict[str, Any]) -> tuple[int, float, float, int]:
        for key, value in params.items():
            if key == "n" and value == 1 or key == "response_format" and value.get("type") == "text":
                continue
            if key not in self.FIELDS:
                raise _unsupported(key, "the transformers-offline executor does plain sampling only")
        max_tokens = params.get("max_tokens") or params.get("max_completion_tokens") or self.default_max_tokens
        return (
            int(max_tokens),
            float(params.get("temperature", 1.0)),
            float(params.get("top_p", 1.0)),
            int(params.get("seed") or 0),
        )

    def generate(self, requests: list[ChatRequest]) -> list[Answer | RequestFailed]:
        results: list[Answer | RequestFailed | None] = [None] * len(requests)
        groups: dict[tuple, list[int]] = {}
        for i, request in enumerate(requests):
            try:
                groups.setdefault(self._settings(request.params), []).append(i)
            except RequestFailed as e:
                results[i] = e
        for (max_tokens, temperature, top_p, seed), members in groups.items():
            started = time.perf_counter()
            inputs: Any = self.tokenizer.apply_chat_template(  # a BatchEncoding (return_dict)
                [requests[i].messages for i in members],
                add_generation_prompt=True,
                padding=True,
                return_tensors="pt",
                return_dict=True,
            )
            if temperature > 0:
                self.torch.manual_seed(seed)
                sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": None}
            else:  # the model's generation config must not turn greedy into sampling
                sampling = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
            with self.torch.no_grad():
                out = self.model.generate(
                    **inputs, max_new_tokens=max_tokens, pad_token_id=self.tokenizer.pad_token_id, **sampling
                )
            elapsed = time.perf_counter() - started
            width = inputs["input_ids"].shape[1]
            for row, i in enumerate(members):
                tokens = out[row, width:].tolist()
                stop = next((k for k, t in enumerate(tokens) if t in self.eos), None)
                kept = tokens if stop is None else tokens[:stop]
                prompt_tokens = int(inputs["attention_mask"][row].sum())
                # one sequence: one string
                text: str = self.tokenizer.decode(kept, skip_special_tokens=True)  # type: ignore[assignment]
                results[i] = Answer(
                    text, "length" if stop is None else "stop", _usage(prompt_tokens, len(kept)), elapsed, cached=False
                )
        return results  # type: ignore[return-value]

    def close(self) -> None:
        del self.model
        gc.collect()


class Batcher:
    """Gathers the requests for one model into batches, one engine call at a time, in a worker thread.

    The first request waits `gather_s` for the others fired in the same moment; later ones queue up
    while a batch runs and form the next. The engine loads (minutes, for a 7B model) on first use."""

    def __init__(self, load: Callable[[], Backend], max_batch: int, gather_s: float = 0.01, label: str = ""):
        self._load = load
        self.max_batch = max_batch
        self.gather_s = gather_s
        self.label = label
        self.batch_sizes: list[int] = []
        self._backend: Backend | None = None
        self._load_error: BaseException | None = None
        self._queue: list[tuple[ChatRequest, asyncio.Future[Answer]]] = []
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"offline-{label}")

    async def submit(self, request: ChatRequest) -> Answer:
        if self._load_error is not None:
            raise self._load_error
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._queue.append((request, future))
        if self._task is None:
            self._wakeup = asyncio.Event()
            self._task = asyncio.create_task(self._run())
        assert self._wakeup is not None
        self._wakeup.set()
        return await future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wakeup is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            await asyncio.sleep(self.gather_s)
            while self._queue:
                batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
                if self._backend is None:
                    try:
                        self._backend = await loop.run_in_executor(self._thread, self._load)
                    except Exception as e:  # noqa: BLE001 - every waiting caller gets the reason
                        self._load_error = EngineLoadFailed(
                            f"could not load '{self.label}' for the offline executor: {type(e).__name__}: {e}"
                        )
                        for _, future in batch + self._queue:
                            if not future.done():
                                future.set_exception(self._load_error)
                        self._queue.clear()
                        return
                requests = [r for r, _ in batch]
                try:
                    results = await loop.run_in_executor(self._thread, self._backend.generate, requests)
                except Exception as e:  # noqa: BLE001 - the engine failed this batch: each request records why
                    results = [RequestFailed("engine_error", f"{type(e).__name__}: {e}") for _ in batch]
                self.batch_sizes.append(len(batch))
                for (_, future), result in zip(batch, results, strict=True):
                    if future.done():  # the caller was cancelled
                        continue
                    if isinstance(result, BaseException):
                        future.set_exception(result)
                    else:
                        future.set_result(result)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        loop = asyncio.get_running_loop()
        if self._backend is not None:
            await loop.run_in_executor(self._thread, self._backend.close)
            self._backend = None
        self._thread.shutdown(wait=True)


class OfflineClient(Client):
    """A `Client` whose local endpoints are answered by in-process engines, one batcher per loaded model."""

    def __init__(
        self,
        endpoints: dict[str, Endpoint],
        cache: Cache | None = None,
        *,
        refresh: bool = False,
        concurrency: int | None = None,
        loader: Callable[[str], tuple[str, Callable[[], Backend]]],
        gather_s: float = 0.01,
    ):
        super().__init__(endpoints, cache, refresh=refresh, concurrency=concurrency)
        self._loader = loader
        self._gather_s = gather_s
        self._batchers: dict[str, Batcher] = {}
        self.remote = {name for name, e in endpoints.items() if urlparse(e.url).hostname not in LOCAL_HOSTS}

    @property
    def batch_sizes(self) -> dict[str, list[int]]:
        return {key: b.batch_sizes for key, b in self._batchers.items()}

    def _batcher(self, model: str) -> Batcher:
        key, load = self._loader(model)
        if key not in self._batchers:
            local = [e for n, e in self.endpoints.items() if n not in self.remote]
            max_batch = self.concurrency or max(e.max_concurrency for e in local)
            self._batchers[key] = Batcher(load, max_batch, self._gather_s, label=key)
        return self._batchers[key]

    async def _send_with_retries(self, name: str, request: ChatRequest) -> Answer:
        if name in self.remote:
            return await super()._send_with_retries(name, request)
        return await self._batcher(request.model).submit(request)

    async def aclose(self) -> None:
        for batcher in self._batchers.values():
            await batcher.aclose()
        self._batchers.clear()
        await super().aclose()


def vllm_loader(endpoints: dict[str, Endpoint], directory: Path) -> Callable[[str], tuple[str, Callable[[], Backend]]]:
    """Which profile answers each model name; refuses up front a set of models that cannot share the GPU."""
    build = vllm_build()
    if build is None:
        raise ConfigError(
            f"the vllm-offline executor needs vLLM, which is not installed here: {vllm_install('cpu')} on CPU, "
            f"{vllm_install('cuda')}"
        )
    local = [e for e in endpoints.values() if urlparse(e.url).hostname in LOCAL_HOSTS]
    chosen = {e.model: profiles.for_model(e.model, directory)[0] for e in local}
    unique = list({p.name: p for p in chosen.values()}.values())
    for p in unique:
        if p.device != build:
            raise ConfigError(
                f"profile '{p.name}' runs on {p.device}, but this environment has vLLM's {build} build; "
                f"the {p.device} build comes with {vllm_install(p.device)}"
            )
    if any(p.on_gpu for p in unique) and shutil.which("nvidia-smi") is None:
        raise ConfigError("the vllm-offline executor needs an NVIDIA GPU for these profiles (nvidia-smi not found)")
    try:
        Plan(unique, [r for r in lifecycle.status() if r.alive], gpu_memory.gpus()).check()
    except ServeError as e:
        raise ConfigError(f"{e}\n(the vllm-offline executor loads these models in this process)") from None

    def load(model: str) -> tuple[str, Callable[[], Backend]]:
        profile = chosen.get(model) or profiles.for_model(model, directory)[0]
        return profile.name, lambda: VllmBackend(profile)

    return load


def transformers_loader(directory: Path) -> Callable[[str], tuple[str, Callable[[], Backend]]]:
    served = {p.served: p for p in profiles.load_all(directory).values()} if directory.is_dir() else {}

    def load(model: str) -> tuple[str, Callable[[], Backend]]:
        if model in served and Path(served[model].model_path()).is_dir():
            path = served[model].model_path()
        elif Path(model).is_dir():
            path = str(Path(model).resolve())
        else:
            raise RequestFailed("model_not_found", f"no profile serves '{model}' and it is not a model directory")
        return path, lambda: TransformersBackend(path)

    return load
