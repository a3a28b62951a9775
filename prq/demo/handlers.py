"""The demo's methods (echo, sum, sleep, flaky) as handlers for `prq worker`.

    prq worker prq.demo.handlers:handle -e poll://billing-1 -c 16          (AsyncQueue.serve)
    prq worker prq.demo.handlers:handle_blocking -e poll://search-1 -c 8   (Queue.serve)

`handle` is a coroutine function, so `prq worker` serves it on one event loop; `handle_blocking`
is a plain function, served by worker threads. Both answer what the demo's nodes answer
(services.compute); `sleep` waits at most `MAX_SLEEP_MS`, so no caller can park a worker.
"""

from __future__ import annotations

import asyncio
import time

from pydantic import JsonValue

from prq.core.models import Request
from prq.demo.services import compute, sleep_ms

__all__ = ["MAX_SLEEP_MS", "handle", "handle_blocking"]

#: Longest wait a `sleep` call gets, milliseconds.
MAX_SLEEP_MS = 60_000.0


async def handle(request: Request) -> JsonValue:
    """echo, sum, sleep or flaky, waiting on the event loop."""
    delay_ms = min(sleep_ms(request), MAX_SLEEP_MS)
    if delay_ms > 0:
        await asyncio.sleep(delay_ms / 1000)
    return compute(request)


def handle_blocking(request: Request) -> JsonValue:
    """echo, sum, sleep or flaky, blocking its worker thread."""
    delay_ms = min(sleep_ms(request), MAX_SLEEP_MS)
    if delay_ms > 0:
        time.sleep(delay_ms / 1000)
    return compute(request)
