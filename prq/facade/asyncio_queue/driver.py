"""AsyncDriver: what an AsyncQueue node owns and how it drives the protocol's flows.

The shared state of the asyncio facade is typed and built here: the Redis link (AsyncRedisIO),
the pub/sub reader and its router, the node watch and its task, the background tasks. Here too:
the lifecycle (start, aclose), `_run` (the one place flows meet Redis and signals), the watch
loop, and the cluster subscriptions (`_listen`). The sender's, receiver's and operator's APIs
are mixins on top (sender, receiver, operator); this module imports none of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from functools import partial
from typing import TYPE_CHECKING, TypeVar

from prq.core.config import QueueSettings, RedisSettings
from prq.core.errors import PrqError
from prq.node.base import SHUTDOWN_POLL_S, QueueBase
from prq.node.data_loss.counters import CallMark
from prq.node.guard import CheckDataLoss, guarded
from prq.node.watch import NodeWatch
from prq.protocol.effects import Exec, Flow, Offload
from prq.protocol.scripts.loading import script_load_calls
from prq.transport.async_io import AsyncRedisIO
from prq.transport.connectors import async_pubsub_connector, shard_layout
from prq.transport.pulse_router import PulseRouter
from prq.transport.pulses import AsyncPulses
from prq.transport.shard_pulses import AsyncShardPulses
from prq.transport.signals import AsyncSignal

if TYPE_CHECKING:
    from prq.datastreams import DataStreamStore

logger = logging.getLogger(__name__)

__all__ = ["AsyncDriver"]

T = TypeVar("T")

#: How long closing waits for pending sends to run their callbacks (QueueShutdown).
SEND_CALLBACKS_TIMEOUT_S = 5.0


class AsyncDriver(QueueBase):
    """AsyncQueue's state, lifecycle and flow driver (the base of its API mixins)."""

    _io: AsyncRedisIO
    _pulses: AsyncPulses | AsyncShardPulses
    _router: PulseRouter[AsyncSignal]

    def __init__(
        self,
        redis_settings: RedisSettings,
        *,
        prefix: str = "prq",
        settings: QueueSettings | None = None,
        datastreams: DataStreamStore | None = None,
        node_id: str | None = None,
    ) -> None:
        super().__init__(
            redis_settings,
            prefix=prefix,
            settings=settings,
            datastreams=datastreams,
            node_id=node_id,
        )
        self._io = AsyncRedisIO(self.redis_settings, self.settings)
        self._router = PulseRouter(self.keys.node_channel(self.node_id), AsyncSignal)
        self._pulses = (
            AsyncShardPulses(self._io.client, self._router)
            if self.keys.sharded
            else AsyncPulses(async_pubsub_connector(self._io.client), self._router)
        )
        self._watch = NodeWatch(self.ctx, self._router, partial(shard_layout, self._io.client))
        self._watch_wake = asyncio.Event()
        self._watch.wake = self._watch_wake.set
        self._watch_task: asyncio.Task[None] | None = None
        self._started = False
        self._start_lock = asyncio.Lock()
        self._background: set[asyncio.Future[None]] = set()

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the scripts and start the pub/sub reader (done on first use if not called)."""
        if self._started:
            return
        async with self._start_lock:
            if self._started:
                return
            if self._closed:
                raise self._shutdown_error()
            loaded, info = await self._io.execute_many(
                [script_load_calls(), *self._server_check_steps()]
            )
            if isinstance(loaded, PrqError):
                raise loaded
            self._server_checked(info)
            await self._pulses.start()
            self._watch_task = asyncio.create_task(self._watch_loop(), name="prq-watch")
            self._started = True
            logger.info("queue started node_id=%s prefix=%s", self.node_id, self.keys.prefix)

    async def aclose(self, *, shutdown_timeout_s: float | None = None) -> None:
        """Shut down: callers still waiting fail with QueueShutdown, and `serve` takes nothing
        new. Requests its `serve` handlers work on get up to `shutdown_timeout_s` to be
        answered (heartbeats go on meanwhile); what is left, and what was dequeued by hand and
        not answered, is given back (at_least_once: queued again for another receiver;
        at_most_once: cancelled, its caller told). Then background work stops.
        `shutdown_timeout_s` overrides the setting (0: give everything back at once)."""
        if self._closing or self._closed:
            return
        self._closing = True
        self._router.wake_all()
        await asyncio.sleep(0)  # let woken waiters observe the shutdown
        if self._started:
            timeout = self.settings.shutdown_timeout_s
            deadline = time.monotonic() + (
                timeout if shutdown_timeout_s is None else shutdown_timeout_s
            )
            while self._serving_held() and time.monotonic() < deadline:
                await asyncio.sleep(SHUTDOWN_POLL_S)  # bounded by the shutdown timeout
            try:
                await self._run(self._hand_back_flow(), closing_ok=True)
            except PrqError as exc:
                logger.warning("could not give back held requests on shutdown error=%s", exc)
        self._closed = True
        self._router.wake_all()
        if self._background:  # sends deliver their QueueShutdown to on_failure first
            await asyncio.wait(list(self._background), timeout=SEND_CALLBACKS_TIMEOUT_S)
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
        await self._pulses.aclose()
        await self._io.aclose()
        logger.info("queue closed node_id=%s", self.node_id)

    async def _run(
        self, flow: Flow[T], mark: CallMark | None = None, *, closing_ok: bool = False
    ) -> T:
        """Drive a flow under the node's rules (prq.node.guard: closing, a declared data loss,
        errors thrown in where it waits): send its calls, wait on its signals, return its
        result. With a `mark` (a call's), the call fails with DataLoss as soon as the node
        declares a loss its request may be one of; once closing began only `closing_ok` flows
        (answers, giving back) go on.
        """
        steps = guarded(self, flow, mark, closing_ok=closing_ok)
        reply: object = None
        error: PrqError | None = None
        while True:
            try:
                effect = steps.throw(error) if error is not None else steps.send(reply)
            except StopIteration as stop:
                result: T = stop.value
                return result
            error, reply = None, None
            try:
                if isinstance(effect, Exec):
                    reply = await self._io.execute(effect.calls)
                elif isinstance(effect, Offload):
                    reply = await asyncio.to_thread(effect.work)
                elif isinstance(effect, CheckDataLoss):
                    await self._check_data_loss_now()
                else:
                    signal = effect.signal
                    assert isinstance(signal, AsyncSignal)
                    await signal.wait(effect.seen, effect.timeout_s)
            except PrqError as exc:
                error = exc
            except BaseException:
                # a cancel (or another error) while the flow waits: the flow's own clean-up
                # (a take's let-go, a `finally`) runs now, not whenever it is collected
                steps.close()
                raise

    async def _check_data_loss_now(self) -> None:
        """A call found its request gone: check now, so that a retry starts in the new epoch."""
        plan = self._watch.plan(time.monotonic(), check_only=True)
        try:
            self._watch.settle(plan, await self._io.execute_many(plan.steps), time.monotonic())
        except PrqError as exc:
            logger.debug("data-loss check failed error=%s", exc)
            self._watch.forget(plan)

    async def _watch_loop(self) -> None:
        """Beat, look for cancellations, check for data loss, renew the signatures and extend
        the stored data of held requests; never dies on an error."""
        while not self._closed:
            plan = self._watch.plan(time.monotonic())
            if plan.steps:
                try:
                    results = await self._io.execute_many(plan.steps)
                except PrqError as exc:
                    logger.debug("watch turn failed error=%s", exc)
                    self._watch.forget(plan)
                else:
                    self._watch.settle(plan, results, time.monotonic())
            if self._streams.sweep_due(time.monotonic()):
                await asyncio.to_thread(self._streams.sweep)
            if self._renewal_due(time.monotonic()):
                try:
                    await self._run(self._renew_flow(), closing_ok=True)
                except PrqError as exc:
                    logger.debug("signature renewal failed error=%s", exc)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._watch.wait_s(time.monotonic())):
                    await self._watch_wake.wait()
            self._watch_wake.clear()

    async def _ready(self, *, closing_ok: bool = False) -> None:
        if not self._started:
            await self.start()
        if self._closed or (self._closing and not closing_ok):
            raise self._shutdown_error()

    async def _listen(self, endpoint: str) -> None:
        """On a cluster: subscribe (once) to this node's channel of `endpoint`, where its
        scripts signal this node (answers, hand-offs, cancellations; keys.EndpointKeys)."""
        if self.keys.sharded:
            channel = self.keys.endpoint(endpoint).node_channel(self.node_id)
            await self._pulses.ensure_subscribed(channel)
