"""The answers of one asyncio serve loop (_AsyncAnswers): which go out together, written by the
handlers' tasks while the node's link has room for another write.
"""

from __future__ import annotations

import asyncio
import logging

from prq.serve.served import AsyncServedQueue
from prq.transport.batches import MAX_ROUND_TRIPS_IN_FLIGHT

logger = logging.getLogger("prq.serve.worker")  # (the serve loops log under one name)

#: Bound on the writers an asyncio serve loop's closing waits for in turn (each writes until
#: nothing is left, within its steps' retry budgets; a writer ends only when its write fails).
FLUSH_ROUNDS = 1000


class _AsyncAnswers:
    """The answers of one asyncio serve loop. A handler's task that finds fewer writes in
    flight than the node's link carries at once (MAX_ROUND_TRIPS_IN_FLIGHT) writes its answer
    at once, with every answer left meanwhile, batch after batch until nothing is left; one
    that finds them all busy leaves its answer and ends: a write in flight carries it next. So
    a lone answer goes out at once, and under load one round trip and one pass through the
    node's answer steps (AsyncQueue._write_answers) carry many answers, without a task waiting
    on each. A request stays held, counted by the loop's backlog (`unwritten`) and serving
    (AsyncQueue._serving), until the write that carries its answer ends."""

    def __init__(self, queue: AsyncServedQueue) -> None:
        self.queue = queue
        self.queued: list[tuple[str, bytes]] = []
        self.sending = 0  # answers in a write
        self.writers: set[asyncio.Task[None]] = set()
        self._written: asyncio.Event | None = None

    @property
    def unwritten(self) -> int:
        return len(self.queued) + self.sending

    def next_written(self) -> asyncio.Event:
        """Set when the next write ends."""
        if self._written is None:
            self._written = asyncio.Event()
        return self._written

    async def answer(self, request_id: str, body: bytes) -> None:
        """Leave an answer; with the link's writes not all in flight, write it (and what is
        left meanwhile) in this task at once, else return at once: a writer carries it."""
        self.queued.append((request_id, body))
        if len(self.writers) >= MAX_ROUND_TRIPS_IN_FLIGHT:
            return
        task = asyncio.current_task()
        assert task is not None
        self.writers.add(task)
        try:
            await self._write()
        finally:
            self.writers.discard(task)
            self.ensure_writing()  # (what a failed write left)

    def ensure_writing(self) -> None:
        """Start a writer if answers wait and the link has room for another write."""
        if self.queued and len(self.writers) < MAX_ROUND_TRIPS_IN_FLIGHT:
            self._start_writer()

    def _start_writer(self) -> None:
        writer = asyncio.ensure_future(self._write())
        self.writers.add(writer)
        writer.add_done_callback(self._writer_ended)

    def _writer_ended(self, writer: asyncio.Task[None]) -> None:
        self.writers.discard(writer)
        if writer.cancelled():
            return
        error = writer.exception()
        if error is not None:
            logger.error("answer writer failed error=%r", error, exc_info=error)
        self.ensure_writing()  # (what a failed writer left is written by another one)

    async def _write(self) -> None:
        """Write what is queued, batch after batch, until nothing is."""
        while self.queued:
            batch, self.queued = self.queued, []
            self.sending += len(batch)
            try:
                failed = await self.queue._write_answers(batch)
            finally:
                self.sending -= len(batch)
                for request_id, _ in batch:
                    self.queue._serving.discard(request_id)
                written, self._written = self._written, None
                if written is not None:
                    written.set()
            for request_id, error in failed.items():
                logger.error("could not answer request_id=%s error=%s", request_id, error)

    async def flush(self) -> None:
        """Wait until every answer left is written (or its write failed)."""
        for _ in range(FLUSH_ROUNDS):
            self.ensure_writing()
            if not self.writers:
                return
            await asyncio.wait(set(self.writers))
