"""What one asyncio serve loop holds: each request in a task that waits for a handler slot, runs
the handler and leaves its answer (_AsyncHeld), and how many requests the loop may take now.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from prq.core.errors import PrqError
from prq.core.lifecycle import PendingRequest
from prq.observe import tracing
from prq.serve.async_answers import _AsyncAnswers
from prq.serve.handled import handler_response
from prq.serve.pace import _Pace
from prq.serve.served import AsyncServedQueue

logger = logging.getLogger("prq.serve.worker")  # (the serve loops log under one name)

#: Requests an asyncio serve loop may hold per handler slot, counting those whose answers are
#: being written (the slot itself is free once the handler returns), besides those it takes
#: ahead.
ANSWER_BACKLOG = 2


class _AsyncHeld:
    """The requests one asyncio serve loop holds: each in a task that waits for a handler
    slot, runs the handler, and answers or leaves its answer to a write in flight (the slot is
    free once the handler returns)."""

    def __init__(
        self,
        queue: AsyncServedQueue,
        run: Callable[[PendingRequest], Awaitable[object]],
        concurrency: int,
    ) -> None:
        self.queue = queue
        self.run = run
        self.concurrency = concurrency
        self.slots = asyncio.Semaphore(concurrency)
        self.pace = _Pace()
        self.tasks: set[asyncio.Task[None]] = set()
        self.unhandled = 0  # held requests whose handler has not returned yet
        self.handler_done = asyncio.Event()
        self.answers = _AsyncAnswers(queue)

    @property
    def taking_ahead(self) -> bool:
        return self.pace.quick

    def room(self) -> int:
        """How many requests the loop may take now: up to `concurrency` not yet handled (twice
        that when taking ahead), and no more than ANSWER_BACKLOG times `concurrency` held
        besides those taken ahead."""
        ahead = self.concurrency if self.pace.quick else 0
        return min(
            self.concurrency + ahead - self.unhandled,
            ANSWER_BACKLOG * self.concurrency + ahead - len(self.tasks) - self.answers.unwritten,
        )

    async def wait_for_room(self) -> None:
        if self.unhandled >= self.concurrency:
            self.handler_done.clear()
            await self.handler_done.wait()
            return
        self.answers.ensure_writing()
        written = asyncio.ensure_future(self.answers.next_written().wait())
        try:
            await asyncio.wait({*self.tasks, written}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            written.cancel()

    def start(self, pending: PendingRequest) -> None:
        self.unhandled += 1
        task = asyncio.create_task(self._handle(pending))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _handle(self, pending: PendingRequest) -> None:
        queue = self.queue
        queue._serving.add(pending.id)
        left = False
        try:
            with tracing.processing(pending, queue.node_id) as traced:
                try:
                    async with self.slots:
                        started = time.monotonic()
                        result: object = None
                        failure: Exception | None = None
                        try:
                            result = await self.run(pending)
                        except Exception as exc:
                            traced.failed(exc)
                            failure = exc
                        response = handler_response(queue.node_id, pending, result, failure)
                        self.pace.ran(time.monotonic() - started)
                finally:
                    self.unhandled -= 1
                    self.handler_done.set()
                try:
                    body, error = await queue._answer_body(response)
                except PrqError as exc:
                    body, error = None, exc
                if error is not None:
                    logger.error("could not answer request_id=%s error=%s", pending.id, error)
                if body is not None:
                    left = True  # (it leaves `_serving` once written)
                    await self.answers.answer(pending.id, body)
        finally:
            if not left:
                queue._serving.discard(pending.id)

    async def finish(self) -> None:
        """Wait until every held request is handled and answered."""
        if self.tasks:
            await asyncio.wait(self.tasks)
        await self.answers.flush()
