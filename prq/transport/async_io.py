"""AsyncRedisIO: the asyncio queue's round trips to Redis, its steps batched on one link.

Every Redis round trip of the queue goes through `AsyncRedisIO.execute` or
`SyncRedisIO.execute` (prq.transport.sync_io, the blocking twin):
- redis-py errors are translated by prq.transport.translate (and raised `from` the original);
- connection-class errors are retried under each step's own retry budget
  (prq.transport.budgets); redis-py's own retries are switched off (prq.transport.client_options)
  so that budget is the only one;
- NOSCRIPT (Redis restarted or flushed its script cache) loads the scripts and sends again.
The batcher is the hot path: it calls what it needs directly, with no wrapper per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from tenacity import AsyncRetrying

from prq.core.config import QueueSettings, RedisSettings
from prq.core.errors import PrqError
from prq.observe import metrics
from prq.protocol.effects import Call, Reply
from prq.protocol.scripts.loading import script_load_calls
from prq.protocol.scripts.merging import merge_calls
from prq.transport.batches import (
    DEFAULT_MAX_BATCH_STEPS,
    MAX_ROUND_TRIPS_IN_FLIGHT,
    IOCounters,
    Outcome,
    _needs_scripts,
    _split,
)
from prq.transport.budgets import STEP_GRACE_S, StepBudgets
from prq.transport.client_options import client_kwargs
from prq.transport.cluster_links import AsyncClusterLink
from prq.transport.links import async_link
from prq.transport.reachability import Reachability
from prq.transport.tls import tls_configuration_error, tls_eof, tls_probe
from prq.transport.topology import aclose_client, async_client
from prq.transport.translate import RedisUnavailable, _closed_error, _unavailable, translate_errors

logger = logging.getLogger(__name__)

__all__ = ["MAX_ROUND_TRIPS_IN_FLIGHT", "AsyncRedisIO"]


def _fail_step(future: asyncio.Future[list[Reply]], error: BaseException) -> None:
    """Fail a waiting step. Its waiter (if it still waits) gets the error when it awaits; one
    that gave up (cancelled) never will, so mark the error seen rather than have asyncio log
    "exception was never retrieved" for it."""
    future.set_exception(error)
    future.exception()


def _settle_step(future: asyncio.Future[list[Reply]], result: Outcome) -> None:
    if future.done():  # its waiter gave up
        return
    if isinstance(result, PrqError):
        _fail_step(future, result)
    else:
        future.set_result(result)


class AsyncRedisIO(IOCounters):
    """Round trips to Redis for the asyncio queue.

    Steps (a few calls each) are sent in batches: while MAX_ROUND_TRIPS_IN_FLIGHT pipelined
    round trips are in flight, the steps that other tasks want to send wait and then go
    together in the next one. A step that finds the link with room is sent at once by its own
    task, so batching adds no latency, and under load it saves most round trips. The first
    attempt is plain; the retry machinery is built only after a connection failure. Batches
    are safe to retry because every prq step is idempotent on replay; each step in one keeps
    its own retry budget (StepBudgets).
    """

    def __init__(self, redis_settings: RedisSettings, settings: QueueSettings) -> None:
        super().__init__()
        self.settings = settings
        self.redis_settings = redis_settings
        self.client: Any = async_client(redis_settings.url, client_kwargs(redis_settings))
        self._pending: list[tuple[Sequence[Call], asyncio.Future[list[Reply]]]] = []
        #: When each pending future was asked for (monotonic), keyed by the future.
        self._asked: dict[asyncio.Future[list[Reply]], float] = {}
        #: Tasks sending queued steps, and round trips in flight (theirs and direct ones).
        self._flushers: set[asyncio.Future[None]] = set()
        self._in_flight = 0
        self._closed = False
        self._link = async_link(self.client)
        self.reachability = Reachability(redis_settings.url, settings.retry_budget_s)
        #: Whether a step's retries may run beside the batcher (a cluster: each pipeline has
        #: connections of its own); one server's link is pipelined (AsyncLink).
        self._overlapping = isinstance(self._link, AsyncClusterLink)
        self._retrying: set[asyncio.Future[None]] = set()
        self._step_deadline_s = (
            settings.retry_budget_s + redis_settings.socket_timeout_s + STEP_GRACE_S
        )

    async def execute(self, calls: Sequence[Call]) -> list[Reply]:
        """Send one step's calls (alone if the link has room, else in the next batch)."""
        if self._closed:
            raise _closed_error()
        if self._in_flight < MAX_ROUND_TRIPS_IN_FLIGHT and not self._pending:
            self._in_flight += 1
            mine: asyncio.Future[list[Reply]] = asyncio.get_running_loop().create_future()
            budget_s = self.settings.retry_budget_s
            try:
                await self._send(
                    StepBudgets(
                        [calls],
                        [time.monotonic()],
                        budget_s,
                        lambda _, r: _settle_step(mine, r),
                    )
                )
            finally:
                self._in_flight -= 1
                self._start_flusher()
            if mine.done():
                return mine.result()  # raises the step's error
            (result,) = await self._wait_steps([mine])  # retried off the batcher (a cluster)
            if isinstance(result, PrqError):
                raise result
            return result
        future: asyncio.Future[list[Reply]] = asyncio.get_running_loop().create_future()
        self._pending.append((calls, future))
        self._asked[future] = time.monotonic()
        self._start_flusher()
        result = (await self._wait_steps([future]))[0]
        if isinstance(result, PrqError):
            raise result
        return result

    async def _wait_steps(
        self, futures: list[asyncio.Future[list[Reply]]]
    ) -> list[list[Reply] | PrqError]:
        """Wait for queued steps, each at most its retry budget (plus a socket timeout): time
        spent queued behind a stuck round trip counts, so no call outlives its budget."""
        results: list[list[Reply] | PrqError] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._step_deadline_s
        for future in futures:
            # one timer handle per step (asyncio.timeout costs several times that, per call):
            # past the deadline the step fails; not sent yet, it never will be (the batcher
            # skips what is done); in flight, its outcome is indeterminate
            timer = loop.call_at(deadline, self._overdue, future)
            try:
                results.append(await future)
            except PrqError as exc:
                results.append(exc)
            finally:
                timer.cancel()
        return results

    def _overdue(self, future: asyncio.Future[list[Reply]]) -> None:
        if not future.done():
            _fail_step(
                future,
                _unavailable(
                    RedisUnavailable("no round trip completed in time"),
                    self.settings.retry_budget_s,
                ),
            )

    async def execute_many(self, steps: Sequence[Sequence[Call]]) -> list[list[Reply] | PrqError]:
        """Send several independent steps in one batch; each gets its own replies or error."""
        if self._closed:
            raise _closed_error()
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[list[Reply]]] = []
        for calls in steps:
            future: asyncio.Future[list[Reply]] = loop.create_future()
            self._pending.append((calls, future))
            self._asked[future] = time.monotonic()
            futures.append(future)
        self._start_flusher()
        return await self._wait_steps(futures)

    def _start_flusher(self) -> None:
        if self._pending and self._in_flight < MAX_ROUND_TRIPS_IN_FLIGHT:
            self._in_flight += 1
            flusher = asyncio.ensure_future(self._flush())
            self._flushers.add(flusher)
            flusher.add_done_callback(self._flushers.discard)

    async def _flush(self) -> None:
        try:
            while self._pending:
                batch = self._pending[:DEFAULT_MAX_BATCH_STEPS]
                del self._pending[: len(batch)]
                for _, future in batch:
                    if future.done():
                        self._asked.pop(future, None)
                batch = [(calls, future) for calls, future in batch if not future.done()]
                if batch:
                    await self._send_batch(batch)
        finally:
            self._in_flight -= 1

    async def _send_batch(
        self, batch: list[tuple[Sequence[Call], asyncio.Future[list[Reply]]]]
    ) -> None:
        asked = [self._asked.pop(future, time.monotonic()) for _, future in batch]
        budgets = StepBudgets(
            [calls for calls, _ in batch],
            asked,
            self.settings.retry_budget_s,
            lambda i, result: _settle_step(batch[i][1], result),
        )
        try:
            await self._send(budgets)
        except BaseException as exc:  # never leave a waiting step behind
            budgets.give_up(exc if isinstance(exc, PrqError) else _closed_error(exc))
            if isinstance(exc, PrqError):
                return
            raise

    async def _send(self, budgets: StepBudgets) -> None:
        """One round trip for the steps, retried on connection errors while any step's budget
        lasts (see StepBudgets); every step is settled, unless another error is raised. On a
        cluster the retries go on in a task of their own, so that the batcher sends the steps
        for the other shards meanwhile (their round trips may overlap there)."""
        try:
            budgets.answered(await self._attempt(budgets.calls()))
            return
        except RedisUnavailable as exc:
            logger.debug("redis attempt failed, retrying error=%s", exc)
            budgets.failed(exc)
        if not budgets.live:
            return
        if self._overlapping:
            task = asyncio.ensure_future(self._retry_apart(budgets))
            self._retrying.add(task)
            task.add_done_callback(self._retrying.discard)
            return
        await self._retry(budgets)

    async def _retry_apart(self, budgets: StepBudgets) -> None:
        try:
            await self._retry(budgets)
        except BaseException as exc:  # never leave a waiting step behind
            budgets.give_up(exc if isinstance(exc, PrqError) else _closed_error(exc))
            if not isinstance(exc, PrqError | asyncio.CancelledError):
                raise

    async def _retry(self, budgets: StepBudgets) -> None:
        # The last attempt starts when the last budget ends and takes a socket timeout at most;
        # should the loop lag past that, the steps fail by the same deadline as a queued step's
        # (_wait_steps), half a second inside the documented bound (budget + socket timeout + 1 s)
        deadline_s = (
            max(0.0, budgets.remaining_s()) + self.redis_settings.socket_timeout_s + STEP_GRACE_S
        )
        try:
            async with asyncio.timeout(deadline_s):
                async for attempt in AsyncRetrying(**budgets.retrying()):
                    with attempt:
                        self.retries += 1
                        metrics.REDIS_RETRIES.inc()
                        budgets.answered(await self._attempt(budgets.calls()))
        except RedisUnavailable:
            assert not budgets.live  # each step was given up when its budget ran out
        except TimeoutError:
            budgets.give_up(
                _unavailable(RedisUnavailable("deadline passed"), self.settings.retry_budget_s)
            )

    async def _attempt(self, calls: Sequence[Call]) -> list[Reply]:
        # answers to one endpoint, and enqueues to one endpoint: one script call each
        sent, spread = merge_calls(calls)
        self.count(sent)
        replies = await self._raw(sent)
        if _needs_scripts(replies):
            await self.load_scripts()
            self.count(sent)
            replies = await self._raw(sent)
        return spread(replies)

    async def _raw(self, calls: Sequence[Call]) -> list[Reply]:
        """One round trip; error replies come back in place, transport errors raise."""
        try:
            with translate_errors():
                replies = await self._link.round_trip(calls)
        except RedisUnavailable as exc:
            if self.redis_settings.tls and tls_eof(exc):
                refused = await asyncio.to_thread(tls_probe, self.redis_settings)
                if refused is not None:
                    raise tls_configuration_error(refused) from exc
            self.reachability.failed(exc)
            raise
        self.reachability.answered()
        return replies

    async def load_scripts(self) -> None:
        """SCRIPT LOAD every prq script (after a restart or SCRIPT FLUSH)."""
        logger.info("loading prq scripts into Redis")
        for result in _split([script_load_calls()], await self._raw(script_load_calls())):
            if isinstance(result, PrqError):
                raise result

    async def aclose(self) -> None:
        """Fail waiting steps with QueueShutdown, stop the flusher, close the connections."""
        self._closed = True
        pending, self._pending = self._pending, []
        for _, future in pending:
            if not future.done():
                _fail_step(future, _closed_error())
        for flusher in list(self._flushers):
            flusher.cancel()
            with contextlib.suppress(BaseException):
                await flusher
        for task in list(self._retrying):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        await self._link.close()
        await aclose_client(self.client)
