"""AsyncQueue: the pending-request queue on asyncio (the core facade).

A queue object is one node: it has a node id, one connection pool, and one pub/sub connection
for all its subscriptions. Lifecycle: created → started (scripts loaded, pub/sub reader up; on
first use or `async with`) → closed (waiting callers fail with QueueShutdown).

AsyncQueue is assembled here from one mixin per API, over one base that holds the node's state:
driver (state, lifecycle, `_run`), sender, receiver, operator. What needs the whole queue stays
here: the context manager, and `serve` (it hands the queue to prq.serve.worker's loop).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from prq.facade.asyncio_queue.operator import AsyncOperator
from prq.facade.asyncio_queue.receiver import AsyncReceiver
from prq.facade.asyncio_queue.sender import AsyncSender
from prq.protocol.effects import Handler
from prq.serve.sigterm import stop_on_sigterm_async

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["AsyncQueue"]


class AsyncQueue(AsyncSender, AsyncReceiver, AsyncOperator):
    """The pending-request queue for asyncio code (the README shows its API)."""

    async def __aenter__(self) -> AsyncQueue:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def serve(
        self,
        endpoint: str,
        handler: Handler,
        *,
        concurrency: int = 1,
        stop: asyncio.Event | None = None,
    ) -> None:
        """Run `handler` for every request of `endpoint` until `stop` is set or the queue closes.

        Without a `stop`, in the main thread, SIGTERM stops it gracefully (prq.serve.sigterm)."""
        from prq.serve.worker import serve_async

        if stop is not None:
            await serve_async(self, endpoint, handler, concurrency=concurrency, stop=stop)
            return
        stop = asyncio.Event()
        with stop_on_sigterm_async(stop):
            await serve_async(self, endpoint, handler, concurrency=concurrency, stop=stop)
