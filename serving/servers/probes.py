"""Is a server's process running, and does it answer: the checks `up`, `down`, `status` and a run's servers make."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import httpx

from cupid.common.processes import alive
from cupid.common.tls import http_get
from cupid.serving.endpoint import bearer

if TYPE_CHECKING:
    from cupid.serving.servers.engines import Engine
    from cupid.serving.servers.profiles import Profile


def healthy(
    base_url: str, paths: tuple[str, ...] = ("/health",), timeout: float = 2.0, api_key: str | None = None
) -> bool:
    """Every path (server-absolute, e.g. `/health`, `/v1/models`) answers 200."""
    root, headers = base_url.removesuffix("/v1"), bearer(api_key)
    try:
        return all(http_get(root + path, timeout=timeout, headers=headers).status_code == 200 for path in paths)
    except httpx.HTTPError:
        return False


def ready(profile: Profile, engine: Engine, timeout: float = 2.0) -> bool:
    """The engine's readiness paths answer and, where the engine lists it, the served model is loaded."""
    key = profile.api_key()
    if not healthy(profile.base_url, engine.ready_paths, timeout, key):
        return False
    if not engine.lists_served_model:
        return True
    try:
        listed = http_get(profile.base_url + "/models", timeout=timeout, headers=bearer(key)).json()
        return profile.served in {m.get("id") for m in listed.get("data", [])}
    except (httpx.HTTPError, ValueError, AttributeError):
        return False


def group_alive(pgid: int) -> bool:
    """Any process of a server's group still running (vLLM's engine processes outlive its API server by a moment)."""
    if alive(pgid):  # also reaps the leader if it is our own zombie
        return True
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
