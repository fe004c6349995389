"""A task's judges on one client: the one way PrefMatcher, the TRL reward and inspect's tasks open theirs (each once
per event loop, through `serving.client.per_loop`)."""

from __future__ import annotations

from collections.abc import Mapping

from cupid.eval.benchmark.taskspec import Scorer, TaskSpec
from cupid.serving.cache import CacheSetting, open_cache
from cupid.serving.client import Client
from cupid.serving.endpoint import Endpoint

Judging = tuple[Client, Scorer]  # a task's judges opened: the client, and the task's scorer on it


def open_judges(
    spec: TaskSpec,
    endpoints: Mapping[str, Endpoint],
    cache: CacheSetting = None,
    concurrency: int | None = None,
    *,
    probe: bool = False,
) -> Judging:
    """One client on the judges' endpoints (each under its role's name, as the task's scorer asks them), through the
    request cache (a path, "default", or None: none), and the task's scorer on it. `concurrency` bounds the requests
    in flight (else each endpoint's own); `probe`: each endpoint is asked once before its first request, so a server
    that is down fails the first call that needs it, by role."""
    client = Client(
        dict(endpoints), open_cache(cache), concurrency=concurrency, roles={r: r for r in endpoints} if probe else None
    )
    return client, spec.scorer(client, {role: role for role in spec.roles})
