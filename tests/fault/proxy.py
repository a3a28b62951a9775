"""FaultProxy: a TCP proxy between one node and Redis that a test can break on demand.

One proxy per node→Redis link, so one node can be partitioned while the others keep working.
It listens on 127.0.0.1 (a free port) and forwards to an upstream on 127.0.0.1; its asyncio loop
runs in a daemon thread of its own, so sync and async tests drive it with plain method calls.
Every mode switch runs on the proxy's loop and has taken effect when the method returns.

Modes (toxiproxy-like):
- `pass_through()` / `restore()`: forward everything (restore also re-listens after `cut`,
  and ends `blackhole`);
- `cut()`: RST every open connection (SO_LINGER 0) and stop listening, so new connects are
  refused, until `restore()`;
- `reset_connections(pubsub_only=False)`: RST every open connection (or only those that sent
  a (P|S)SUBSCRIBE), keep accepting;
- `blackhole(drop=False)`: keep accepting, forward nothing either way, never reset: clients
  time out. Bytes are held (like TCP across a partition that heals) and flow on `restore()`;
  with `drop=True` they are discarded instead, and `restore()` resets the connections that lost
  bytes (their byte streams are no longer RESP);
- `drop_pubsub_messages(True)`: on the way back to the client drop only pub/sub message frames
  (RESP2 and RESP3, see tests/fault/resp.py); every other frame passes intact;
- `drop_replies(True)`: the other way round: drop every reply on its way back to the client,
  pub/sub messages passing (commands still reach Redis and run: their replies are lost);
  `drop_replies(True, to=b"...")` drops only the replies to the commands holding those bytes
  (each connection's replies are matched to its commands in order), so that everything else,
  a new connection's handshake included, goes on working;
- `latency(ms)`: delay every chunk, both directions, by `ms` (no throughput cap);
- `retarget(port)`: new connections go to another upstream (a promoted replica).

Counters: `accepted`, `dropped_frames`, `resets`, `discarded_bytes` (by a dropping
blackhole), `open_connections`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from prq.embedded import free_port
from tests.fault.resp import RespError, RespFrames, is_pubsub_message

logger = logging.getLogger(__name__)

__all__ = ["LOOPBACK", "FaultProxy"]

#: The only address the proxy listens on or connects to.
LOOPBACK = "127.0.0.1"
#: Bound of one mode switch, and of close().
CONTROL_TIMEOUT_S = 10.0
#: Bytes read at once from either side.
CHUNK_BYTES = 64 * 1024
#: Chunks queued per direction before the reader stops reading (back pressure).
QUEUE_CHUNKS = 64

T = TypeVar("T")

#: A (P|S)SUBSCRIBE command as a client sends it (marks the connection as a pub/sub one).
_SUBSCRIBE_RE = re.compile(rb"\*\d+\r\n\$(?:9|10)\r\n[PS]?SUBSCRIBE\r\n", re.IGNORECASE)


def _rst(writer: asyncio.StreamWriter | None) -> None:
    """Close a connection with RST (SO_LINGER 0) instead of FIN."""
    if writer is None:
        return
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Link:
    """One client connection and its upstream connection."""

    def __init__(self, proxy: FaultProxy, client: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.frames: RespFrames | None = RespFrames() if proxy.parse_resp else None
        #: The commands the client sent, parsed to match each reply to its command (None once
        #: the stream is not RESP); per command sent and not answered yet, whether its reply is
        #: to be dropped (`drop_replies(to=...)`).
        self.commands: RespFrames | None = RespFrames() if proxy.parse_resp else None
        self.unanswered: deque[bool] = deque()
        self.subscriber = False  # the client sent a (P|S)SUBSCRIBE
        self.lost_bytes = False  # a drop-mode blackhole discarded some of its bytes
        self.closed = False

    def reset(self) -> None:
        if self.closed:
            return
        self.closed = True
        _rst(self.client)
        _rst(self.upstream)
        for task in self.tasks:
            task.cancel()
        self.proxy._links.discard(self)

    def close(self) -> None:
        """Graceful close of both sides (one side ended its stream)."""
        if self.closed:
            return
        self.closed = True
        for writer in (self.client, self.upstream):
            if writer is not None:
                writer.close()
        for task in self.tasks:
            if task is not asyncio.current_task():
                task.cancel()
        self.proxy._links.discard(self)

    def client_bytes(self, data: bytes) -> None:
        """Note the commands in client→server bytes (forwarded as they are)."""
        if self.commands is None:
            return
        try:
            sent = self.commands.feed(data)
        except RespError:
            self.commands = None  # (an inline command: replies are not matched any more)
            self.unanswered.clear()
            return
        match = self.proxy._drop_replies_to
        self.unanswered.extend(match is not None and match in command for command in sent)

    def server_bytes(self, data: bytes) -> bytes:
        """Server→client bytes to forward now (whole frames when parsing; filtered)."""
        if self.frames is None:
            return data
        try:
            frames = self.frames.feed(data)
        except RespError as exc:
            logger.warning("proxy port=%d: not RESP (%s); forwarding raw", self.proxy.port, exc)
            held = self.frames.take_pending()
            self.frames = None
            return held
        proxy = self.proxy
        if self.subscriber:
            self.unanswered.clear()  # (a subscriber's replies are not matched to commands)
            if not (proxy._drop_pubsub or proxy._drop_replies):
                return b"".join(frames)
            pubsub = proxy._drop_replies  # (what is kept: messages, or all but them)
            kept = [f for f in frames if is_pubsub_message(f, resp2_subscriber=True) == pubsub]
        else:
            kept = []
            for frame in frames:
                if is_pubsub_message(frame, resp2_subscriber=False):  # (a RESP3 push)
                    if not proxy._drop_pubsub:
                        kept.append(frame)
                    continue
                # (a reply: to the oldest command not answered yet)
                flagged = self.unanswered.popleft() if self.unanswered else False
                if not (proxy._drop_replies or flagged):
                    kept.append(frame)
        proxy.dropped_frames += len(frames) - len(kept)
        return b"".join(kept)


class FaultProxy:
    """A TCP proxy to a Redis on 127.0.0.1 with switchable faults (see the module docstring)."""

    def __init__(self, upstream_port: int, *, parse_resp: bool = True, name: str = "") -> None:
        self.upstream_port = upstream_port
        self.parse_resp = parse_resp
        self.name = name or f"proxy-{upstream_port}"
        self.port = free_port()
        self.accepted = 0
        self.dropped_frames = 0
        self.resets = 0
        self.discarded_bytes = 0
        self._links: set[_Link] = set()
        self._server: asyncio.Server | None = None
        self._placeholder: socket.socket | None = None
        self._flowing: asyncio.Event | None = None
        self._drop_pubsub = False
        self._drop_replies = False
        self._drop_replies_to: bytes | None = None
        self._drop_held = False
        self._latency_s = 0.0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name=self.name, daemon=True)
        self._thread.start()
        self._call(lambda: None)  # the loop is running
        self._await(self._listen())

    # -- plumbing -----------------------------------------------------------------------------

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def _call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the proxy's loop and wait (bounded) for its result."""
        future: Future[T] = Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        return future.result(CONTROL_TIMEOUT_S)

    def _await(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the proxy's loop and wait (bounded) for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(CONTROL_TIMEOUT_S)

    @property
    def url(self) -> str:
        """redis:// URL that reaches the upstream through this proxy."""
        return f"redis://{LOOPBACK}:{self.port}/0"

    @property
    def open_connections(self) -> int:
        return len(self._links)

    @property
    def listening(self) -> bool:
        return self._server is not None

    async def _listen(self) -> None:
        if self._flowing is None:
            self._flowing = asyncio.Event()
            self._flowing.set()
        if self._server is None:
            if self._placeholder is not None:
                self._placeholder.close()
                self._placeholder = None
            self._server = await asyncio.start_server(
                self._accept, LOOPBACK, self.port, reuse_address=True, backlog=512
            )

    def _hold_port(self) -> None:
        """Keep the port bound while not listening: connects are refused (RST to the SYN), and
        no other socket (say, an outgoing connection's ephemeral port) can take it meanwhile."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((LOOPBACK, self.port))
        except OSError:
            sock.close()
            logger.warning("%s could not hold port=%d while cut", self.name, self.port)
            return
        self._placeholder = sock

    def _reset_all(self, pubsub_only: bool = False) -> int:
        links = [link for link in self._links if link.subscriber or not pubsub_only]
        for link in links:
            link.reset()
        self.resets += len(links)
        return len(links)

    # -- modes --------------------------------------------------------------------------------

    def pass_through(self) -> None:
        """Forward everything: undo cut, blackhole, dropping and latency."""
        self.restore()
        self._call(self._clear_toxics)

    def _clear_toxics(self) -> None:
        self._drop_pubsub = False
        self._drop_replies = False
        self._drop_replies_to = None
        self._latency_s = 0.0

    def restore(self) -> None:
        """End `cut` (listen again) and `blackhole` (held bytes flow)."""

        async def restore() -> None:
            await self._listen()
            assert self._flowing is not None
            if self._drop_held:
                for link in [link for link in self._links if link.lost_bytes]:
                    link.reset()
                    self.resets += 1
            self._drop_held = False
            self._flowing.set()

        self._await(restore())
        logger.info("%s restored", self.name)

    def cut(self) -> int:
        """RST every open connection and refuse new ones until `restore()`; returns the count."""

        async def cut() -> int:
            if self._server is not None:
                self._server.close()  # stop listening first, so nothing slips in
                self._server = None
                self._hold_port()
            return self._reset_all()

        count = self._await(cut())
        logger.info("%s cut connections=%d", self.name, count)
        return count

    def reset_connections(self, *, pubsub_only: bool = False) -> int:
        """RST every open connection (or only those that subscribed); returns the count.

        New connections are still accepted.
        """
        count = self._call(lambda: self._reset_all(pubsub_only))
        logger.info("%s reset connections=%d", self.name, count)
        return count

    def blackhole(self, *, drop: bool = False) -> None:
        """Forward nothing either way, reset nothing, keep accepting (until `restore()`)."""

        def hole() -> None:
            assert self._flowing is not None
            self._drop_held = drop
            self._flowing.clear()

        self._call(hole)
        logger.info("%s blackhole drop=%s", self.name, drop)

    def drop_pubsub_messages(self, enabled: bool = True) -> None:
        """Drop (or stop dropping) pub/sub message frames on their way to the client."""
        if enabled and not self.parse_resp:
            raise ValueError("drop_pubsub_messages needs a proxy with parse_resp=True")

        def switch() -> None:
            self._drop_pubsub = enabled

        self._call(switch)

    def drop_replies(self, enabled: bool = True, *, to: bytes | None = None) -> None:
        """Drop (or stop dropping) every reply on its way to the client, or with `to` only
        the replies to the commands sent from now on that hold those bytes; pub/sub messages
        pass. What the client sends still runs: only its replies are lost."""
        if enabled and not self.parse_resp:
            raise ValueError("drop_replies needs a proxy with parse_resp=True")

        def switch() -> None:
            if not enabled:  # (a command sent before has its reply dropped still)
                self._drop_replies, self._drop_replies_to = False, None
            elif to is None:
                self._drop_replies = True
            else:
                self._drop_replies_to = to

        self._call(switch)

    def latency(self, ms: float) -> None:
        """Delay every chunk in both directions by `ms` milliseconds (0 to stop)."""

        def switch() -> None:
            self._latency_s = max(0.0, ms) / 1000.0

        self._call(switch)

    def retarget(self, port: int, host: str = LOOPBACK) -> None:
        """New connections go to 127.0.0.1:`port` (open ones stay where they are)."""
        if host != LOOPBACK:
            raise ValueError(f"the fault proxy only connects to {LOOPBACK}, not {host!r}")

        def switch() -> None:
            self.upstream_port = port

        self._call(switch)
        logger.info("%s retargeted to port=%d", self.name, port)

    def close(self) -> None:
        """Stop listening, reset every connection, stop the loop (bounded)."""
        if self._loop.is_closed():
            return
        if self._thread.is_alive():

            async def shutdown() -> None:
                if self._server is not None:
                    self._server.close()
                    self._server = None
                if self._placeholder is not None:
                    self._placeholder.close()
                    self._placeholder = None
                self._reset_all()
                current = asyncio.current_task()
                tasks = [t for t in asyncio.all_tasks() if t is not current]
                for task in tasks:
                    task.cancel()
                if tasks:
                    await asyncio.wait(tasks, timeout=CONTROL_TIMEOUT_S)
                self._reset_all()  # links accepted meanwhile

            with contextlib.suppress(Exception):
                self._await(shutdown())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(CONTROL_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- forwarding ---------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        link = _Link(self, writer)
        self._links.add(link)
        try:
            # (asyncio.timeout, not wait_for: Python 3.11's wait_for drops the result of a
            # connect that completes as it is cancelled, leaking the connection)
            async with asyncio.timeout(CONTROL_TIMEOUT_S):
                up_reader, up_writer = await asyncio.open_connection(LOOPBACK, self.upstream_port)
        except (OSError, TimeoutError):
            link.reset()  # upstream down: the client sees a reset, as with a dead server
            return
        except asyncio.CancelledError:  # the proxy closing: nothing of the link left open
            link.reset()
            raise
        if link.closed:  # reset while connecting
            _rst(up_writer)
            return
        link.upstream = up_writer
        for source, sink, upstream in ((reader, up_writer, True), (up_reader, writer, False)):
            queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUE_CHUNKS)
            link.tasks.add(asyncio.create_task(self._read(link, source, queue, upstream)))
            link.tasks.add(asyncio.create_task(self._write(link, sink, queue)))

    async def _read(
        self,
        link: _Link,
        source: asyncio.StreamReader,
        queue: asyncio.Queue[tuple[float, bytes]],
        to_upstream: bool,
    ) -> None:
        try:
            while True:
                data = await source.read(CHUNK_BYTES)
                if not data:
                    await queue.put((0.0, b""))  # end of stream, after what is queued
                    return
                if to_upstream:
                    if not link.subscriber and _SUBSCRIBE_RE.search(data):
                        link.subscriber = True
                    link.client_bytes(data)
                else:
                    data = link.server_bytes(data)
                    if not data:
                        continue
                await queue.put((time.monotonic() + self._latency_s, data))
        except (OSError, asyncio.IncompleteReadError):
            link.reset()

    async def _write(
        self,
        link: _Link,
        sink: asyncio.StreamWriter,
        queue: asyncio.Queue[tuple[float, bytes]],
    ) -> None:
        flowing = self._flowing
        assert flowing is not None
        try:
            while True:
                due, data = await queue.get()
                if not flowing.is_set():
                    if self._drop_held and data:
                        link.lost_bytes = True
                        self.discarded_bytes += len(data)
                        continue
                    await flowing.wait()
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                if not data:
                    link.close()
                    return
                sink.write(data)
                await sink.drain()
        except OSError:
            link.reset()
