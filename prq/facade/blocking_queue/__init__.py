"""Queue: the blocking twin of AsyncQueue, driving the same flows with blocking calls.

Same methods, same semantics; pub/sub is read by one daemon thread per queue. Safe to share one
Queue between threads.

Queue is assembled here from one mixin per API, over one base that holds the node's state:
driver (state, lifecycle, `_run`), sender, receiver, operator. What needs the whole queue stays
here: the context manager, and `serve` (it hands the queue to prq.serve.worker's loop).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from prq.facade.blocking_queue.operator import BlockingOperator
from prq.facade.blocking_queue.receiver import BlockingReceiver
from prq.facade.blocking_queue.sender import BlockingSender
from prq.protocol.effects import Handler
from prq.serve.sigterm import stop_on_sigterm

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["Queue"]


class Queue(BlockingSender, BlockingReceiver, BlockingOperator):
    """The pending-request queue for blocking code (the README shows its API)."""

    def __enter__(self) -> Queue:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def serve(
        self,
        endpoint: str,
        handler: Handler,
        *,
        concurrency: int = 1,
        stop: threading.Event | None = None,
    ) -> None:
        """Run `handler` for every request of `endpoint` until `stop` is set or the queue closes.

        Without a `stop`, in the main thread, SIGTERM stops it gracefully (prq.serve.sigterm)."""
        from prq.serve.worker import serve_sync

        if stop is not None:
            serve_sync(self, endpoint, handler, concurrency=concurrency, stop=stop)
            return
        stop = threading.Event()
        with stop_on_sigterm(stop):
            serve_sync(self, endpoint, handler, concurrency=concurrency, stop=stop)
