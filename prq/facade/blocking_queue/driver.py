"""BlockingDriver: what a Queue node owns and how it drives the protocol's flows, with
blocking calls.

The shared state of the blocking facade is typed and built here: the Redis link (SyncRedisIO),
the pub/sub reader thread and its router, the node watch and its thread. Here too: the
lifecycle (start, close), `_run` (the one place flows meet Redis and signals), the watch loop,
and the cluster subscriptions (`_listen`). The sender's, receiver's and operator's APIs are
mixins on top (sender, receiver, operator); this module imports none of them.
"""

from __future__ import annotations

import logging
import threading
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
from prq.transport.connectors import shard_layout, sync_pubsub_connector
from prq.transport.pulse_router import PulseRouter
from prq.transport.pulses import ThreadPulses
from prq.transport.shard_pulses import ThreadShardPulses
from prq.transport.signals import ThreadSignal
from prq.transport.sync_io import SyncRedisIO

if TYPE_CHECKING:
    from prq.datastreams import DataStreamStore

logger = logging.getLogger(__name__)

#: How long a close waits for a watch turn in flight, seconds, before closing the connections
#: under it, and again after: a turn waiting on a node that does not answer (a master killed,
#: its address silent) would hold the close up to a socket timeout. A turn cut short is one
#: beat or check fewer of a node that is closing.
WATCH_STOP_S = 0.5

__all__ = ["BlockingDriver"]

T = TypeVar("T")


class BlockingDriver(QueueBase):
    """Queue's state, lifecycle and flow driver (the base of its API mixins)."""

    _io: SyncRedisIO
    _pulses: ThreadPulses | ThreadShardPulses
    _router: PulseRouter[ThreadSignal]

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
        self._io = SyncRedisIO(self.redis_settings, self.settings)
        self._router = PulseRouter(self.keys.node_channel(self.node_id), ThreadSignal)
        self._pulses = (
            ThreadShardPulses(self._io.client, self._router)
            if self.keys.sharded
            else ThreadPulses(sync_pubsub_connector(self._io.client), self._router)
        )
        self._watch = NodeWatch(self.ctx, self._router, partial(shard_layout, self._io.client))
        self._watch_wake = threading.Event()
        self._watch.wake = self._watch_wake.set
        self._watch_thread: threading.Thread | None = None
        self._started = False
        self._start_lock = threading.Lock()
        self._close_lock = threading.Lock()

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Load the scripts and start the pub/sub reader (done on first use if not called)."""
        with self._start_lock:
            if self._started:
                return
            if self._closed:
                raise self._shutdown_error()
            loaded, info = self._io.execute_many([script_load_calls(), *self._server_check_steps()])
            if isinstance(loaded, PrqError):
                raise loaded
            self._server_checked(info)
            self._pulses.start()
            self._watch_thread = threading.Thread(
                target=self._watch_loop, name="prq-watch", daemon=True
            )
            self._watch_thread.start()
            self._started = True
            logger.info("queue started node_id=%s prefix=%s", self.node_id, self.keys.prefix)

    def close(self, *, shutdown_timeout_s: float | None = None) -> None:
        """Shut down: callers still waiting fail with QueueShutdown, and `serve` takes nothing
        new. Requests its `serve` handlers work on get up to `shutdown_timeout_s` to be
        answered (heartbeats go on meanwhile); what is left, and what was dequeued by hand and
        not answered, is given back (at_least_once: queued again for another receiver;
        at_most_once: cancelled, its caller told). Then background work stops.
        `shutdown_timeout_s` overrides the setting (0: give everything back at once)."""
        with self._close_lock:
            if self._closing or self._closed:
                return
            self._closing = True
        self._router.wake_all()
        if self._started:
            timeout = self.settings.shutdown_timeout_s
            deadline = time.monotonic() + (
                timeout if shutdown_timeout_s is None else shutdown_timeout_s
            )
            while self._serving_held() and time.monotonic() < deadline:
                time.sleep(SHUTDOWN_POLL_S)  # bounded by the shutdown timeout
            try:
                self._run(self._hand_back_flow(), closing_ok=True)
            except PrqError as exc:
                logger.warning("could not give back held requests on shutdown error=%s", exc)
        self._closed = True
        self._router.wake_all()
        self._watch_wake.set()
        watch = self._watch_thread
        if watch is not None:
            watch.join(timeout=WATCH_STOP_S)
        self._pulses.close()
        self._io.close()  # (wakes a turn still reading: its connections are closed under it)
        if watch is not None:
            watch.join(timeout=WATCH_STOP_S)
            if watch.is_alive():  # (on a connection the client no longer holds: it ends by
                # itself at its socket timeout, and the loop then sees the queue closed)
                logger.debug("watch turn still waiting on Redis after the close")
        logger.info("queue closed node_id=%s", self.node_id)

    def _run(self, flow: Flow[T], mark: CallMark | None = None, *, closing_ok: bool = False) -> T:
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
                    reply = self._io.execute(effect.calls, express=effect.express)
                elif isinstance(effect, Offload):
                    reply = effect.work()
                elif isinstance(effect, CheckDataLoss):
                    self._check_data_loss_now()
                else:
                    signal = effect.signal
                    assert isinstance(signal, ThreadSignal)
                    signal.wait(effect.seen, effect.timeout_s)
            except PrqError as exc:
                error = exc
            except BaseException:  # (another error while the flow waits: its clean-up now)
                steps.close()
                raise

    def _check_data_loss_now(self) -> None:
        """A call found its request gone: check now, so that a retry starts in the new epoch."""
        plan = self._watch.plan(time.monotonic(), check_only=True)
        try:
            self._watch.settle(plan, self._io.execute_many(plan.steps), time.monotonic())
        except PrqError as exc:
            logger.debug("data-loss check failed error=%s", exc)
            self._watch.forget(plan)

    def _watch_loop(self) -> None:
        """Beat, look for cancellations, check for data loss, renew the signatures and extend
        the stored data of held requests; never dies on an error from Redis."""
        while not self._closed:
            try:
                self._watch_turn()
            except Exception:
                if self._closed:  # (a turn the close cut short, whatever it raised)
                    return
                raise
            self._watch_wake.wait(self._watch.wait_s(time.monotonic()))
            self._watch_wake.clear()

    def _watch_turn(self) -> None:
        """One turn of the watch loop."""
        plan = self._watch.plan(time.monotonic())
        if plan.steps:
            try:
                results = self._io.execute_many(plan.steps)
            except PrqError as exc:
                logger.debug("watch turn failed error=%s", exc)
                self._watch.forget(plan)
            else:
                self._watch.settle(plan, results, time.monotonic())
        if self._streams.sweep_due(time.monotonic()):
            self._streams.sweep()
        if self._renewal_due(time.monotonic()):
            try:
                self._run(self._renew_flow(), closing_ok=True)
            except PrqError as exc:
                logger.debug("signature renewal failed error=%s", exc)

    def _ready(self, *, closing_ok: bool = False) -> None:
        if not self._started:
            self.start()
        if self._closed or (self._closing and not closing_ok):
            raise self._shutdown_error()

    def _listen(self, endpoint: str) -> None:
        """On a cluster: subscribe (once) to this node's channel of `endpoint` (see
        AsyncQueue._listen)."""
        if self.keys.sharded:
            channel = self.keys.endpoint(endpoint).node_channel(self.node_id)
            self._pulses.ensure_subscribed(channel)
