"""The client a run uses, by its executor: over HTTP to servers (`serving.client.Client`), or answered by an
engine inside this process (`serving.offline`). Every command that runs requests builds its client here."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

from cupid.common.config import ConfigError
from cupid.serving import offline
from cupid.serving.cache import Cache
from cupid.serving.client import Client
from cupid.serving.endpoint import Endpoint
from cupid.serving.servers import profiles

Executor = Literal["http", "vllm-offline", "transformers-offline"]  # a run config's `executor:`
EXECUTORS: tuple[str, ...] = get_args(Executor)


def open_client(
    executor: str,
    endpoints: dict[str, Endpoint],
    cache: Cache | None = None,
    refresh: bool = False,
    concurrency: int | None = None,
    profiles_dir: str | Path = profiles.DEFAULT_DIR,
    servers: dict | None = None,
    roles: dict[str, str] | None = None,
) -> Client:
    """The client for an executor: `http` (servers), `vllm-offline` (in-process vLLM, GPU) or
    `transformers-offline` (in-process transformers, CPU). Raises ConfigError when it cannot run here."""
    if executor == "http":
        return Client(
            endpoints,
            cache,
            refresh=refresh,
            concurrency=concurrency,
            servers=servers,
            roles=roles,
            down_hint=profiles.start_hint(profiles_dir),
        )
    if executor == "vllm-offline":
        loader = offline.vllm_loader(endpoints, Path(profiles_dir))
    elif executor == "transformers-offline":
        loader = offline.transformers_loader(Path(profiles_dir))
    else:
        raise ConfigError(f"unknown executor {executor!r} (known: {', '.join(EXECUTORS)})")
    return offline.OfflineClient(endpoints, cache, refresh=refresh, concurrency=concurrency, loader=loader)
