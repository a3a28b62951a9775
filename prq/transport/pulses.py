"""Pulses: the one pub/sub connection per node, and the signals that waits listen to.

A node subscribes to its own channel (responses for the requests it sent) and to the pulse
channel of each endpoint it dequeues from; never one channel per request. Every message fires
a `Signal` that waits listen to. Pub/sub drops messages (disconnects, failovers, slow readers),
so a signal is only a hint: every wait also polls Redis after `poll_interval_s`, and after a
reconnect every signal fires so that all waits poll at once.

States of the reader: connected → (error) → backing off → reconnected → every signal fired.

Node channel messages are `r|<request id>|<response JSON or empty>`; an empty response means
"it is stored, read it". Several of them for one node, answered in one step, travel as one
message `m|<len>|<message><len>|<message>...` (each with its length in bytes before it).

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
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Generic, TypeVar

from prq.core.jitter import jitter
from prq.transport.links import send_packed
from prq.transport.redis_io import RedisUnavailable, translate_errors

logger = logging.getLogger(__name__)

__all__ = [
    "AsyncPulses",
    "AsyncSignal",
    "PulseRouter",
    "PulsesBase",
    "Signal",
    "ThreadPulses",
    "ThreadSignal",
]

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
#: How long one read of the asyncio pub/sub loop waits before it looks at its state again.
READ_STEP_S = 1.0
#: How long closing waits for that loop to end (it ends within a read step once told to).
CLOSE_WAIT_S = 3 * READ_STEP_S


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
    """A signal awaited on the event loop (fired from the same loop). A wait is one future and
    one timer handle: it runs once per call, so it avoids asyncio.Event and asyncio.timeout,
    which cost several times that."""

    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        super().__init__()
        self._waiters: list[asyncio.Future[None]] = []

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            _release(waiter)

    async def wait(self, seen: int, timeout_s: float) -> None:
        """Return once the generation moved past `seen`, or after `timeout_s`."""
        if self.generation != seen or timeout_s <= 0:
            return
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        timer = loop.call_later(timeout_s, _release, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            if waiter in self._waiters:  # timed out or cancelled: not woken
                self._waiters.remove(waiter)


def _release(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


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


#: Most messages one framed pulse may carry (a bound on the parse of a hostile message).
MAX_FRAMED = 100_000


def unframe(data: bytes) -> Iterator[bytes]:
    """The messages of a framed pulse's body (`<len>|<message><len>|<message>...`); a damaged
    frame ends the iteration (what came before it is kept: pulses are hints, polls find the
    rest)."""
    at, end = 0, len(data)
    for _ in range(MAX_FRAMED):
        if at >= end:
            return
        bar = data.find(b"|", at, at + 12)
        if bar < 0:
            return
        size = data[at:bar]
        if not size.isdigit():
            return
        at = bar + 1 + int(size)
        if at > end:
            return
        yield data[bar + 1 : at]


class PulseRouter(Generic[S]):
    """Maps channels, request ids and take tokens to signals; pure, shared by both readers.

    Node channel messages: `r|<id>|<response or empty>` (a response), `t|<token>|<id>` (a
    hand-off), `c|<id>|<reason>` (a held request was cancelled), `m|...` (several of those,
    framed: `unframe`). Each waiting take has its own
    signal: an endpoint pulse fires the signals of every take waiting on that endpoint; a
    hand-off fires only the signal of its token (the take then collects and so confirms it).
    """

    def __init__(self, node_channel: str, make_signal: Callable[[], S]) -> None:
        self.node_channel = node_channel.encode()
        #: On a cluster the node's channels are one per endpoint, `<endpoint tag>:n:<node>`
        #: (keys.EndpointKeys.node_channel): recognised by this ending.
        self._node_suffix = b":n:" + self.node_channel.rpartition(b":")[2]
        self._make = make_signal
        self._takes: dict[bytes, dict[str, S]] = {}
        self._tokens: dict[str, S] = {}
        self._responses: dict[str, S] = {}
        self.messages = 0
        #: Called with (request id, reason) for a `c|<id>|<reason>` pulse (a cancel after pickup).
        self.on_cancel: Callable[[str, str], None] | None = None

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

    @contextlib.contextmanager
    def watch_take(self, channel: str, token: str) -> Iterator[S]:
        """A signal for one take: fired by the endpoint's pulses and by hand-offs to `token`."""
        signal = self._make()
        waiting = self._takes.setdefault(channel.encode(), {})
        waiting[token] = signal
        self._tokens[token] = signal
        try:
            yield signal
        finally:
            waiting.pop(token, None)
            self._tokens.pop(token, None)

    @property
    def watched_responses(self) -> int:
        return len(self._responses)

    def dispatch(self, channel: bytes, data: bytes) -> None:
        self.messages += 1
        if channel != self.node_channel and not channel.endswith(self._node_suffix):
            for signal in list(self._takes.get(channel, {}).values()):
                signal.fire()
            return
        kind, _, rest = data.partition(b"|")
        if kind == b"m":
            for message in unframe(rest):
                self._dispatch_node(message)
            return
        self._dispatch_node(data)

    def _dispatch_node(self, data: bytes) -> None:
        kind, _, rest = data.partition(b"|")
        key, _, payload = rest.partition(b"|")
        name = key.decode("ascii", errors="replace")
        if kind == b"r":
            response_signal = self._responses.get(name)
            if response_signal is not None:
                response_signal.fire(payload or None)
        elif kind == b"t":
            take_signal = self._tokens.get(name)
            if take_signal is not None:
                take_signal.fire()
        elif kind == b"c" and self.on_cancel is not None:
            self.on_cancel(name, payload.decode("ascii", errors="replace"))

    def poke_response(self, request_id: str) -> None:
        """Wake the wait for one response so that it reads Redis now."""
        signal = self._responses.get(request_id)
        if signal is not None:
            signal.fire()

    def wake_all(self) -> None:
        """Fire every signal (after a reconnect, when pulses may have been lost)."""
        takes = [signal for waiting in self._takes.values() for signal in waiting.values()]
        for signal in [*takes, *self._responses.values()]:
            signal.fire()


class _Subscriber(Generic[S]):
    """What both readers share: wanted and confirmed channels, link health, message handling.

    Pure: the readers do the I/O and call `handle` with each raw reply of the connection.
    """

    def __init__(self, router: PulseRouter[S], *, sharded: bool = False) -> None:
        self.router: PulseRouter[S] = router
        #: A shard's reader (SSUBSCRIBE) starts with no channel; the one reader of a server
        #: starts with the node's channel.
        self.desired: set[str] = set() if sharded else {router.node_channel.decode()}
        self.confirmed: set[str] = set()
        self.command = "SSUBSCRIBE" if sharded else "SUBSCRIBE"
        #: Called when a link is lost, and with a channel the server unsubscribed (its slot
        #: moved to another master): a sharded reader's owner routes its channels again.
        self.on_lost: Callable[[], None] = lambda: None
        self.on_moved: Callable[[str], None] = lambda channel: None
        self.recovering = False
        self.reconnects = 0
        self._last_seen = time.monotonic()
        self._pinged = False

    def handle(self, reply: object) -> str | None:
        """Dispatch one reply; return the channel it confirms, if it is a subscribe reply."""
        self._last_seen = time.monotonic()
        self._pinged = False
        if not isinstance(reply, list) or len(reply) < 2:
            return None
        kind = reply[0]
        if kind in (b"message", b"smessage") and len(reply) == 3:
            channel, data = reply[1], reply[2]
            if isinstance(channel, bytes) and isinstance(data, bytes):
                self.router.dispatch(channel, data)
        elif kind == b"sunsubscribe" and isinstance(reply[1], bytes):
            moved = reply[1].decode()
            self.confirmed.discard(moved)
            self.desired.discard(moved)
            self.on_moved(moved)
        elif kind in (b"subscribe", b"ssubscribe") and isinstance(reply[1], bytes):
            channel_name = reply[1].decode()
            self.confirmed.add(channel_name)
            if self.recovering:
                self.recovering = False
                self.router.wake_all()
            return channel_name
        return None

    def next_action(self) -> str | None:
        """After a quiet read: "ping" the link, "reconnect" a silent one, or nothing."""
        silent = time.monotonic() - self._last_seen
        if silent > DEFAULT_DEAD_AFTER_S:
            return "reconnect"
        if silent > DEFAULT_PING_AFTER_S and not self._pinged:
            self._pinged = True
            return "ping"
        return None

    def lost(self, exc: BaseException, failures: int) -> float:
        """Note a lost link; return how long to back off before reconnecting."""
        level = logging.WARNING if failures == 1 else logging.DEBUG
        logger.log(level, "pub/sub link lost error=%s failures=%d", exc, failures)
        self.reconnects += 1
        self.confirmed.clear()
        self.recovering = True
        self.router.wake_all()  # pulses may have been lost: every wait polls now
        self._last_seen = time.monotonic()
        self.on_lost()
        return float(min(DEFAULT_RECONNECT_MAX_S, 0.05 * 2 ** min(failures, 10)) * jitter())


class PulsesBase:
    """What both readers report: how many channels they hold and how often they reconnected."""

    _state: _Subscriber[Any]

    @property
    def subscriptions(self) -> int:
        return len(self._state.desired)

    @property
    def reconnects(self) -> int:
        return self._state.reconnects

    @property
    def links(self) -> int:
        """Pub/sub connections held: one (on a cluster, one per master:
        prq.transport.shard_pulses)."""
        return 1


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
        #: Makes a fresh connection (links.async_pubsub_connector): at start, after each loss.
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
        #: Makes a fresh connection (links.sync_pubsub_connector): at start, after each loss.
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
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.disconnect()
