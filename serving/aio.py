"""Async code called from blocking code."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Callable, Coroutine, TypeVar

T = TypeVar("T")


def blocking(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to its end from blocking code. Where an event loop already runs in this thread (a
    notebook, an async server), it cannot be blocked on: the coroutine then gets a loop of its own on a
    worker thread. `make` builds the coroutine in the thread that runs it."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()
