"""Pulses: the one pub/sub connection per node, read by an asyncio task or a daemon thread.

A node subscribes to its own channel and to the pulse channel of each endpoint it dequeues from
(prq.transport.pulse_router); every message fires a `Signal` (prq.transport.signals) that waits
listen to. Pub/sub drops messages (disconnects, failovers, slow readers), so a signal is only a
hint: every wait also polls Redis after `poll_interval_s`, and after a reconnect every signal
fires so that all waits poll at once.

States of the reader: connected → (error) → backing off → reconnected → every signal fired
(the state itself, without I/O: prq.transport.subscriptions).

On a Redis Cluster the channels are shard channels, one reader per master:
prq.transport.shard_pulses runs these readers (SSUBSCRIBE) and routes each channel to the master
that serves its slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from prq.transport.pulse_router import PulseRouter
from prq.transport.signals import AsyncSignal, ThreadSignal
from prq.transport.subscriptions import DEFAULT_SUBSCRIBE_CONFIRM_S, PulsesBase, _Subscriber
from prq.transport.translate import RedisUnavailable, translate_errors
from prq.transport.wire import send_packed

logger = logging.getLogger(__name__)

__all__ = ["AsyncPulses", "ThreadPulses"]


#: How long one read of the blocking reader waits (it also sends queued subscribes).
DEFAULT_THREAD_READ_SLICE_S = 0.05
#: How long one read of the asyncio pub/sub loop waits before it looks at its state again.
READ_STEP_S = 1.0
#: How long closing waits for that loop to end (it ends within a read step once told to).
CLOSE_WAIT_S = 3 * READ_STEP_S


class AsyncPulses(PulsesBase):
    """The node's pub/sub connection (owned, not pooled), read by one asyncio task."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[Any]],
        router: PulseRouter[AsyncSignal],
        *,
        sharded: bool = False,
    ) -> None:
        self.router = router
        self._state = _Subscriber(router, sharded=sharded)
        #: Makes a fresh connection (connectors.async_pubsub_connector): at start, after each loss.
        self._connect = connect
        # redis-py's connection classes are only partly typed; this stays internal.
        self._conn: Any = None
        self._confirm_waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._send_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    async def start(self) -> None:
        """Connect, subscribe to the channels wanted from the start (the node's channel on one
        server; none for a shard's reader), and read from then on."""
        first = sorted(self._state.desired)
        with translate_errors():
            self._conn = await self._connect()
            await self._conn.connect()
            if first:
                await send_packed(self._conn, [(self._state.command, *first)])
            async with asyncio.timeout(DEFAULT_SUBSCRIBE_CONFIRM_S):
                while not self._state.confirmed.issuperset(first):
                    self._handle(
                        await self._conn.read_response(disconnect_on_error=False, push_request=True)
                    )
        self._task = asyncio.create_task(self._read_loop(), name="prq-pulses")

    async def ensure_subscribed(self, channel: str) -> None:
        """Subscribe (once) and wait, bounded, for Redis to confirm; polling covers failure."""
        state = self._state
        if channel in state.confirmed:
            return
        future = asyncio.get_running_loop().create_future()
        self._confirm_waiters.setdefault(channel, []).append(future)
        try:
            if channel not in state.desired:
                state.desired.add(channel)
                if self._conn is not None:  # else the read loop connects, and subscribes it
                    async with self._send_lock:
                        with translate_errors():
                            await send_packed(self._conn, [(state.command, channel)])
            async with asyncio.timeout(DEFAULT_SUBSCRIBE_CONFIRM_S):
                await future
        except (RedisUnavailable, TimeoutError) as exc:
            logger.warning("subscribe not confirmed channel=%s error=%s", channel, exc)
        finally:
            waiters = self._confirm_waiters.get(channel, [])
            if future in waiters:
                waiters.remove(future)

    @property
    def wanted(self) -> set[str]:
        return self._state.desired

    def forget(self, channel: str) -> None:
        """Stop wanting `channel` (it moved to another shard's reader): it is not subscribed
        again after a reconnect (the server unsubscribes it when its slot moves)."""
        self._state.desired.discard(channel)
        self._state.confirmed.discard(channel)

    async def start_quietly(self) -> None:
        """Start; if the node cannot be reached now, the read loop keeps trying to."""
        try:
            await self.start()
        except Exception as exc:
            logger.debug("pub/sub start deferred error=%s", exc)
            if self._task is None:
                self._task = asyncio.create_task(self._read_loop(), name="prq-pulses")

    def _handle(self, reply: object) -> None:
        confirmed = self._state.handle(reply)
        if confirmed is not None:
            for future in self._confirm_waiters.pop(confirmed, []):
                if not future.done():
                    future.set_result(None)

    async def _read_loop(self) -> None:
        # Ends on cancel, or on `_closing` at the next step (at most READ_STEP_S away): a cancel
        # that lands as the read's own timeout fires can be taken for that timeout (asyncio.
        # timeout in redis-py's read), and the loop must not outlive aclose because of that.
        failures = 0
        while not self._closing:
            try:
                with translate_errors():
                    await self._step()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._closing:
                    return
                failures += 1
                await self._reconnect(self._state.lost(exc, failures))

    async def _step(self) -> None:
        if self._conn is None:
            raise RedisUnavailable("pub/sub link not connected")
        reply = await self._conn.read_response(
            timeout=READ_STEP_S, disconnect_on_error=False, push_request=True
        )
        if reply is not None:
            self._handle(reply)
            return
        action = self._state.next_action()
        if action == "ping":
            async with self._send_lock:
                await send_packed(self._conn, [("PING",)])
        elif action == "reconnect":
            raise RedisUnavailable("pub/sub link silent; reconnecting")

    async def _reconnect(self, backoff_s: float) -> None:
        with contextlib.suppress(Exception):
            await self._conn.disconnect(nowait=True)
        await asyncio.sleep(backoff_s)
        try:
            async with self._send_lock:
                with translate_errors():
                    self._conn = await self._connect()
                    await self._conn.connect()
                    if self._state.desired:
                        await send_packed(
                            self._conn, [(self._state.command, *sorted(self._state.desired))]
                        )
        except Exception as exc:
            logger.debug("pub/sub resubscribe failed error=%s", exc)

    async def aclose(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            # bounded: should the cancel be lost (see _read_loop), the loop ends by itself
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(self._task), CLOSE_WAIT_S)
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.disconnect(nowait=True)


class ThreadPulses(PulsesBase):
    """The node's pub/sub connection, read by one daemon thread (the only one touching it)."""

    def __init__(
        self,
        connect: Callable[[], Any],
        router: PulseRouter[ThreadSignal],
        *,
        sharded: bool = False,
    ) -> None:
        self.router = router
        self._state = _Subscriber(router, sharded=sharded)
        #: Makes a fresh connection (connectors.sync_pubsub_connector): at start, after each loss.
        self._connect = connect
        self._conn: Any = None
        self._requests: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._confirm = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._connected = False

    def start(self) -> None:
        self._thread = threading.Thread(target=self._read_loop, name="prq-pulses", daemon=True)
        self._thread.start()
        for channel in sorted(self._state.desired):
            self.ensure_subscribed(channel)

    def ensure_subscribed(self, channel: str) -> None:
        """Subscribe (once) and wait, bounded, for Redis to confirm; polling covers failure."""
        with self._confirm:
            if channel in self._state.confirmed:
                return
            if channel not in self._state.desired:
                self._state.desired.add(channel)
                self._requests.put(channel)
            if not self._confirm.wait_for(
                lambda: channel in self._state.confirmed, DEFAULT_SUBSCRIBE_CONFIRM_S
            ):
                logger.warning("subscribe not confirmed channel=%s", channel)

    @property
    def wanted(self) -> set[str]:
        return self._state.desired

    def want(self, channel: str) -> None:
        """Subscribe to `channel` without waiting for Redis to confirm it."""
        with self._confirm:
            if channel not in self._state.desired:
                self._state.desired.add(channel)
                self._requests.put(channel)

    def forget(self, channel: str) -> None:
        """Stop wanting `channel` (see AsyncPulses.forget)."""
        with self._confirm:
            self._state.desired.discard(channel)
            self._state.confirmed.discard(channel)

    def _read_loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                with translate_errors():
                    self._step()
                failures = 0
            except Exception as exc:
                if self._stop.is_set():
                    return
                failures += 1
                backoff_s = self._state.lost(exc, failures)
                self._connected = False
                if self._conn is not None:
                    with contextlib.suppress(Exception):
                        self._conn.disconnect()
                self._stop.wait(backoff_s)

    def _step(self) -> None:
        if not self._connected:
            if self._stop.is_set():
                return
            self._conn = self._connect()
            self._conn.connect()
            self._connected = True
            with self._confirm:
                wanted = sorted(self._state.desired)
            if wanted:
                self._conn.send_command(self._state.command, *wanted)
        pending = []
        while not self._requests.empty():
            pending.append(self._requests.get_nowait())
        if pending:
            self._conn.send_command(self._state.command, *pending)
        if self._conn.can_read(timeout=DEFAULT_THREAD_READ_SLICE_S):
            with self._confirm:
                self._state.handle(
                    self._conn.read_response(disconnect_on_error=False, push_request=True)
                )
                self._confirm.notify_all()
            return
        action = self._state.next_action()
        if action == "ping":
            self._conn.send_command("PING")
        elif action == "reconnect":
            raise RedisUnavailable("pub/sub link silent; reconnecting")

    def close(self) -> None:
        self._stop.set()
        # Closed before the thread is waited for: a read or a handshake it is blocked in, on a
        # node that does not answer (a dead master's address), ends at once.
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.disconnect()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.disconnect()
