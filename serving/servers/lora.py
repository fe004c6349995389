"""Adapters loaded into a running vLLM server, and unloaded, without a restart: a profile with `runtime_lora_rank`
(--enable-lora with a rank and a slot for them, VLLM_ALLOW_RUNTIME_LORA_UPDATING; `serving.servers.profiles`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from cupid.common.errors import ServeError
from cupid.common.tls import http_post
from cupid.serving.endpoint import bearer


def _lora_call(base_url: str, action: str, body: dict[str, Any], api_key: str | None, timeout: float = 120) -> None:
    try:
        response = http_post(
            f"{base_url}/{action}_lora_adapter",
            json=body,
            headers=bearer(api_key),
            timeout=timeout,
        )
    except httpx.HTTPError as e:
        raise ServeError(f"{base_url}: {action}_lora_adapter failed: {e}") from e
    if response.status_code != 200:
        raise ServeError(
            f"{base_url}: {action}_lora_adapter {body['lora_name']!r}: "
            f"HTTP {response.status_code} {response.text[:500]}"
        )


def load_lora(base_url: str, name: str, path: str | Path, api_key: str | None = None) -> None:
    """Load a LoRA adapter into a running vLLM server (one started with a `runtime_lora_rank`); it then answers as
    `name`. In place: loading a name the server already holds (a run stopped before it unloaded) replaces it."""
    _lora_call(base_url, "load", {"lora_name": name, "lora_path": str(path), "load_inplace": True}, api_key)


def unload_lora(base_url: str, name: str, api_key: str | None = None, timeout: float = 120) -> None:
    _lora_call(base_url, "unload", {"lora_name": name}, api_key, timeout)
