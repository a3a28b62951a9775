"""Pulses: the one pub/sub connection per node, and the signals that waits listen to.

A node subscribes to its own channel (responses for the requests it sent) and to the pulse
channel of each endpoint it dequeues from; never one channel per request. Every message fires
a `Signal` that waits listen to. Pub/sub drops messages (disconnects, failovers, slow readers),
so a signal is only a hint: every wait also polls Redis after `poll_interval_s`, and after a
reconnect every signal fires so that all waits poll at once.

States of the reader: connected → (error) → backing off → reconnected → every signal fired.

Node channel messages are `r|<request id>|<response JSON or empty>`; an empty response means
"it is stored, read it".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

import redis
import redis.asyncio
import redis.asyncio.client

from prq.redis_io import RedisUnavailable, translate_errors

logger = logging.getLogger(__name__)

__all__ = ["AsyncPulses", "AsyncSignal", "PulseRouter", "Signal", "ThreadPulses", "ThreadSignal"]

#: How long a subscribe waits for Redis to confirm before relying on polling alone.
DEFAULT_SUBSCRIBE_CONFIRM_S = 2.0
#: Silence on the pub/sub link after which the reader pings Redis.
DEFAULT_PING_AFTER_S = 5.0
#: Silence (no message, no pong) after which the link is presumed dead and reconnected.
DEFAULT_DEAD_AFTER_S = 15.0
#: Largest pause between reconnect attempts.
DEFAULT_RECONNECT_MAX_S = 2.0
#: How long one read of the blocking reader waits (it also sends queued subscribes).
DEFAULT_THREAD_READ_SLICE_S = 0.05


class Signal:
    """A pulse target: `generation` grows on every fire; `payload` holds the last message."""

    __slots__ = ("generation", "payload")

    def __init__(self) -> None:
        self.generation = 0
        self.payload: bytes | None = None

    def fire(self, payload: bytes | None = None) -> None:
        self.generation += 1
        self.payload = payload
        self._wake()

    def _wake(self) -> None:
        raise NotImplementedError


class AsyncSignal(Signal):
    """A signal awaited on the event loop (fired from the same loop)."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        super().__init__()
        self._event = asyncio.Event()

    def _wake(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def wait(self, seen: int, timeout_s: float) -> None:
        """Return once the generation moved past `seen`, or after `timeout_s`."""
        if self.generation != seen or timeout_s <= 0:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._event.wait()


class ThreadSignal(Signal):
    """A signal waited on by threads (fired from the reader thread)."""

    __slots__ = ("_cond",)

    def __init__(self) -> None:
        super().__init__()
        self._cond = threading.Condition()

    def fire(self, payload: bytes | None = None) -> None:
        with self._cond:
            super().fire(payload)

    def _wake(self) -> None:
        self._cond.notify_all()

    def wait(self, seen: int, timeout_s: float) -> None:
        """Return once the generation moved past `seen`, or after `timeout_s`."""
        with self._cond:
            self._cond.wait_for(lambda: self.generation != seen, timeout_s)


S = TypeVar("S", bound=Signal)


class PulseRouter(Generic[S]):
    """Maps channels and request ids to signals; pure, shared by both readers."""

    def __init__(self, node_channel: str, make_signal: Callable[[], S]) -> None:
        self.node_channel = node_channel.encode()
        self._make = make_signal
        self._endpoints: dict[bytes, S] = {}
        self._responses: dict[str, S] = {}
        self.messages = 0

    def endpoint_signal(self, channel: str) -> S:
        """The shared signal of an endpoint's pulse channel."""
        key = channel.encode()
        signal = self._endpoints.get(key)
        if signal is None:
            signal = self._endpoints[key] = self._make()
        return signal

    @contextlib.contextmanager
    def watch_response(self, request_id: str) -> Iterator[S]:
        """A signal for one request's response, registered for the duration of the block."""
        signal = self._make()
        self._responses[request_id] = signal
        try:
            yield signal
        finally:
            if self._responses.get(request_id) is signal:
                del self._responses[request_id]

    @property
    def watched_responses(self) -> int:
        return len(self._responses)

    def dispatch(self, channel: bytes, data: bytes) -> None:
        self.messages += 1
        if channel == self.node_channel:
            kind, _, rest = data.partition(b"|")
            request_id, _, payload = rest.partition(b"|")
            if kind == b"r":
                signal = self._responses.get(request_id.decode("ascii", errors="replace"))
                if signal is not None:
                    signal.fire(payload or None)
            return
        endpoint_signal = self._endpoints.get(channel)
        if endpoint_signal is not None:
            endpoint_signal.fire()

    def wake_all(self) -> None:
        """Fire every signal (after a reconnect, when pulses may have been lost)."""
        for signal in [*self._endpoints.values(), *self._responses.values()]:
            signal.fire()


class _LinkHealth:
    """Tracks silence on the pub/sub link to decide when to ping and when to reconnect."""

    def __init__(self) -> None:
        self.last_seen = time.monotonic()
        self.pinged = False

    def saw_traffic(self) -> None:
        self.last_seen = time.monotonic()
        self.pinged = False

    def next_action(self) -> str | None:
        silent = time.monotonic() - self.last_seen
        if silent > DEFAULT_DEAD_AFTER_S:
            return "reconnect"
        if silent > DEFAULT_PING_AFTER_S and not self.pinged:
            self.pinged = True
            return "ping"
        return None


def _backoff(failures: int) -> float:
    return float(min(DEFAULT_RECONNECT_MAX_S, 0.05 * 2 ** min(failures, 10)) * random.random())


class AsyncPulses:
    """The node's pub/sub connection, read by one asyncio task."""

    def __init__(self, client: redis.asyncio.Redis, router: PulseRouter[AsyncSignal]) -> None:
        self.router = router
        self._pubsub: redis.asyncio.client.PubSub = client.pubsub()
        self._desired: set[str] = set()
        self._confirmed: set[str] = set()
        self._confirm_waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._health = _LinkHealth()
        self._recovering = False
        self.reconnects = 0

    @property
    def subscriptions(self) -> int:
        return len(self._desired)

    async def start(self) -> None:
        await self.ensure_subscribed(self.router.node_channel.decode())
        self._task = asyncio.create_task(self._read_loop(), name="prq-pulses")

    async def ensure_subscribed(self, channel: str) -> None:
        """Subscribe (once) and wait, bounded, for Redis to confirm; polling covers failure."""
        self._desired.add(channel)
        if channel in self._confirmed:
            return
        future = asyncio.get_running_loop().create_future()
        self._confirm_waiters.setdefault(channel, []).append(future)
        try:
            async with self._lock:
                with translate_errors():
                    await self._pubsub.subscribe(channel)
            if self._task is None:  # no reader yet: read the confirmation here
                await self._read_until_confirmed(channel)
            async with asyncio.timeout(DEFAULT_SUBSCRIBE_CONFIRM_S):
                await future
        except (RedisUnavailable, TimeoutError) as exc:
            logger.warning("subscribe not confirmed channel=%s error=%s", channel, exc)
        finally:
            waiters = self._confirm_waiters.get(channel, [])
            if future in waiters:
                waiters.remove(future)

    async def _read_until_confirmed(self, channel: str) -> None:
        async with asyncio.timeout(DEFAULT_SUBSCRIBE_CONFIRM_S):
            while channel not in self._confirmed:
                with translate_errors():
                    message = await self._pubsub.get_message(timeout=0.5)
                if message is not None:
                    self._handle(message)

    def _handle(self, message: dict[str, object]) -> None:
        self._health.saw_traffic()
        kind = message["type"]
        channel = message["channel"]
        if kind == "message" and isinstance(channel, bytes):
            data = message["data"]
            self.router.dispatch(channel, data if isinstance(data, bytes) else b"")
        elif kind == "subscribe" and isinstance(channel, bytes):
            name = channel.decode()
            self._confirmed.add(name)
            for future in self._confirm_waiters.pop(name, []):
                if not future.done():
                    future.set_result(None)
            if self._recovering:
                self._recovering = False
                self.router.wake_all()

    async def _read_loop(self) -> None:
        failures = 0
        while True:
            try:
                with translate_errors():
                    await self._step()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                await self._recover(exc, failures)

    async def _step(self) -> None:
        message = await self._pubsub.get_message(timeout=1.0)
        if message is not None:
            self._handle(message)
            return
        action = self._health.next_action()
        if action == "ping":
            async with self._lock:
                await self._pubsub.ping()
        elif action == "reconnect":
            raise RedisUnavailable("pub/sub link silent; reconnecting")

    async def _recover(self, exc: Exception, failures: int) -> None:
        level = logging.WARNING if failures == 1 else logging.DEBUG
        logger.log(level, "pub/sub link lost error=%s failures=%d", exc, failures)
        self.reconnects += 1
        self._confirmed.clear()
        self._recovering = True
        self.router.wake_all()
        conn = self._pubsub.connection
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.disconnect()
        await asyncio.sleep(_backoff(failures))
        try:
            async with self._lock:
                with translate_errors():
                    await self._pubsub.subscribe(*self._desired)
            self._health.saw_traffic()
        except Exception as again:
            logger.debug("pub/sub resubscribe failed error=%s", again)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        with contextlib.suppress(Exception):
            await self._pubsub.aclose()  # type: ignore[no-untyped-call]


class ThreadPulses:
    """The node's pub/sub connection, read by one daemon thread (the only one touching it)."""

    def __init__(self, client: redis.Redis, router: PulseRouter[ThreadSignal]) -> None:
        self.router = router
        self._pubsub = client.pubsub()  # type: ignore[no-untyped-call]
        self._desired: set[str] = set()
        self._confirmed: set[str] = set()
        self._requests: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._confirm = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._health = _LinkHealth()
        self._recovering = False
        self.reconnects = 0

    @property
    def subscriptions(self) -> int:
        return len(self._desired)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._read_loop, name="prq-pulses", daemon=True)
        self._thread.start()
        self.ensure_subscribed(self.router.node_channel.decode())

    def ensure_subscribed(self, channel: str) -> None:
        """Subscribe (once) and wait, bounded, for Redis to confirm; polling covers failure."""
        with self._confirm:
            if channel in self._confirmed:
                return
            if channel not in self._desired:
                self._desired.add(channel)
                self._requests.put(channel)
            if not self._confirm.wait_for(
                lambda: channel in self._confirmed, DEFAULT_SUBSCRIBE_CONFIRM_S
            ):
                logger.warning("subscribe not confirmed channel=%s", channel)

    def _handle(self, message: dict[str, object]) -> None:
        self._health.saw_traffic()
        kind = message["type"]
        channel = message["channel"]
        if kind == "message" and isinstance(channel, bytes):
            data = message["data"]
            self.router.dispatch(channel, data if isinstance(data, bytes) else b"")
        elif kind == "subscribe" and isinstance(channel, bytes):
            with self._confirm:
                self._confirmed.add(channel.decode())
                self._confirm.notify_all()
            if self._recovering:
                self._recovering = False
                self.router.wake_all()

    def _read_loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                with translate_errors():
                    self._step()
                failures = 0
            except Exception as exc:
                failures += 1
                self._recover(exc, failures)

    def _step(self) -> None:
        pending = []
        while not self._requests.empty():
            pending.append(self._requests.get_nowait())
        if pending:
            self._pubsub.subscribe(*pending)
        if self._pubsub.connection is None:
            self._stop.wait(DEFAULT_THREAD_READ_SLICE_S)
            return
        message = self._pubsub.get_message(timeout=DEFAULT_THREAD_READ_SLICE_S)
        if message is not None:
            self._handle(message)
            return
        action = self._health.next_action()
        if action == "ping":
            self._pubsub.ping()
        elif action == "reconnect":
            raise RedisUnavailable("pub/sub link silent; reconnecting")

    def _recover(self, exc: Exception, failures: int) -> None:
        if self._stop.is_set():
            return
        level = logging.WARNING if failures == 1 else logging.DEBUG
        logger.log(level, "pub/sub link lost error=%s failures=%d", exc, failures)
        self.reconnects += 1
        with self._confirm:
            self._confirmed.clear()
        self._recovering = True
        self.router.wake_all()
        conn = self._pubsub.connection
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.disconnect()
        self._stop.wait(_backoff(failures))
        for channel in list(self._desired):
            self._requests.put(channel)
        self._health.saw_traffic()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(Exception):
            self._pubsub.close()
