"""Async code called from blocking code."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import Any, Generic, TypeVar

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


class PerLoop(Generic[T]):
    """One `T` per event loop (aiohttp sessions belong to one loop), opened by `open` on the loop's first `get()`
    and closed by `close` on that loop: at `aclose()`, or at the latest when the loop finalizes its async generators
    (`asyncio.run` does before it returns), so code that never closes leaves nothing open.

    The closing is an async generator suspended at its `yield`: the loop holds it among the generators it
    finalizes (`shutdown_asyncgens`), so what a loop's calls opened is closed on it, once."""

    def __init__(
        self,
        open: Callable[[], T],
        close: Callable[[T], Coroutine[Any, Any, None]],
        *,
        cleanup: Callable[[T], None] | None = None,
    ):
        self._open, self._close, self._cleanup = open, close, cleanup
        self._items: dict[asyncio.AbstractEventLoop, tuple[T, AsyncGenerator[None, None]]] = {}

    async def get(self) -> T:
        """This loop's `T`, opened on its first call."""
        loop = asyncio.get_running_loop()
        if loop not in self._items:
            item = self._open()
            held = self._held(loop, item)
            self._items[loop] = (item, held)
            await anext(held)  # runs to its `yield` at once: the loop now finalizes it
        return self._items[loop][0]

    async def _held(self, loop: asyncio.AbstractEventLoop, item: T) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            if loop in self._items and self._items[loop][0] is item:
                del self._items[loop]
            await self._close(item)

    async def aclose(self) -> None:
        """Close this event loop's `T` (again: nothing to do)."""
        opened = self._items.get(asyncio.get_running_loop())
        if opened is not None:
            await opened[1].aclose()

    def close(self) -> None:
        """Close what loops not running now left open (again: nothing to do). A loop closed without finalizing its
        generators cannot close its sockets any more: `cleanup` releases what it can (a cache file)."""
        for loop, (item, held) in list(self._items.items()):
            if loop.is_running():
                raise RuntimeError("close() while its event loop runs: `await aclose()` on it instead")
            if not loop.is_closed():
                loop.run_until_complete(held.aclose())
            else:
                self._items.pop(loop, None)
                if self._cleanup is not None:
                    self._cleanup(item)
