"""current_request(), and the calls that run a handler with it set.

A coroutine handler runs on the serve loop, a plain one in a worker thread (so the loop and its
heartbeats never wait on the handler's CPU); either way `current_request()` names the request
being handled. Imports nothing of the serve loops themselves.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import cast

from prq.core.lifecycle import PendingRequest
from prq.core.models import Request
from prq.protocol.effects import Handler

_current: contextvars.ContextVar[PendingRequest | None] = contextvars.ContextVar(
    "prq_current_request", default=None
)


def current_request() -> PendingRequest | None:
    """The PendingRequest being handled (inside a `serve` handler); None elsewhere."""
    return _current.get()


def _is_async(handler: Handler) -> bool:
    call = type(handler).__call__ if not inspect.isfunction(handler) else None
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


def _run_sync_handler(handler: Handler, pending: PendingRequest) -> object:
    token = _current.set(pending)
    try:
        result = handler(pending.request)
        if inspect.isawaitable(result):
            return asyncio.run(_await(result))
        return result
    finally:
        _current.reset(token)


async def _await(awaitable: Awaitable[object]) -> object:
    return await awaitable


def _async_runner(
    handler: Handler, concurrency: int
) -> Callable[[PendingRequest], Awaitable[object]]:
    """Run a coroutine handler on the loop, a plain one in a worker thread."""
    if _is_async(handler):
        async_handler = cast(Callable[[Request], Awaitable[object]], handler)

        async def run_on_loop(pending: PendingRequest) -> object:
            token = _current.set(pending)
            try:
                return await async_handler(pending.request)
            finally:
                _current.reset(token)

        return run_on_loop

    executor = ThreadPoolExecutor(concurrency, thread_name_prefix="prq-handler")

    async def run_in_thread(pending: PendingRequest) -> object:
        loop = asyncio.get_running_loop()
        # in the task's context (as asyncio.to_thread): the handler sees its trace span
        run = contextvars.copy_context().run
        return await loop.run_in_executor(executor, run, _run_sync_handler, handler, pending)

    return run_in_thread
