"""Pulses on a Redis Cluster: sharded pub/sub, one reader per master the node listens on.

Every channel prq publishes to on a cluster is a shard channel of one endpoint's slot: the
endpoint's pulse channel, and the node channels of its requests (`<endpoint tag>:n:<node>`,
keys.EndpointKeys.node_channel). The scripts publish with SPUBLISH
(scripts.loading.for_cluster), which only the master that serves the slot (and its replicas)
hears. So a node keeps one pub/sub connection per master that serves a channel it wants
(prq.transport.pulses.AsyncPulses or ThreadPulses reading SSUBSCRIBE replies), never one per
request: it subscribes to a node channel once per endpoint it calls or serves, and to a pulse
channel once per endpoint it serves.

Which master serves a channel is read from the slot table redis-py keeps for the node's cluster
client, the layout the command link shares (prq.transport.cluster_layout). A channel is routed
again when its reader loses its link (the master died, or was demoted: it is the layout's failed
node, read again without it), when the server unsubscribes it (its slot moved), and when the
layout drops a master that failed (a replica was promoted): the channel is subscribed on the
master the layout names then; a reader left with no channel is closed, so nothing waits on, or
keeps connecting to, a master the layout no longer has. Pulses are hints: a wait polls anyway, so a
pulse lost while a channel moves costs latency, never an outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Coroutine, Mapping
from typing import Any, Protocol, TypeVar

from redis.crc import key_slot

from prq.transport.cluster_layout import async_layout, sync_layout
from prq.transport.connectors import async_node_connector, sync_node_connector
from prq.transport.pulse_router import PulseRouter
from prq.transport.pulses import AsyncPulses, ThreadPulses
from prq.transport.signals import AsyncSignal, ThreadSignal
from prq.transport.subscriptions import DEFAULT_SUBSCRIBE_CONFIRM_S, PulsesBase

logger = logging.getLogger(__name__)

__all__ = ["AsyncShardPulses", "ThreadShardPulses"]

#: How long a caller waits for another thread's first subscription of a channel (that one's
#: own wait is bounded by prq.transport.subscriptions.DEFAULT_SUBSCRIBE_CONFIRM_S).
FIRST_SUBSCRIBE_WAIT_S = DEFAULT_SUBSCRIBE_CONFIRM_S + 1.0


def _owner(client: Any, channel: str) -> str | None:
    """The name (host:port) of the master that serves `channel`'s slot, as the client knows."""
    try:
        return str(client.nodes_manager.get_node_from_slot(key_slot(channel.encode())).name)
    except Exception:
        return None


class _Wanting(Protocol):
    """What routing needs of a reader (AsyncPulses, ThreadPulses)."""

    @property
    def wanted(self) -> set[str]: ...

    def forget(self, channel: str) -> None: ...


_R = TypeVar("_R", bound=_Wanting)


def _moves(
    client: Any, home: dict[str, str], readers: Mapping[str, _Wanting]
) -> list[tuple[str, str]]:
    """The channels whose master is not the one the layout names now (or whose reader lost
    them), each with its master now; the channel is forgotten by its old reader and homed anew
    (the caller subscribes it there)."""
    moves = []
    for channel, was in list(home.items()):
        owner = _owner(client, channel)
        reader = readers.get(was)
        if owner is None or (owner == was and reader and channel in reader.wanted):
            continue
        if reader is not None:
            reader.forget(channel)
        home[channel] = owner
        moves.append((channel, owner))
    return moves


def _idle(home: dict[str, str], readers: dict[str, _R]) -> list[tuple[str, _R]]:
    """The readers that want no channel and serve no channel's master, taken off `readers`."""
    idle = [
        (master, reader)
        for master, reader in list(readers.items())
        if not reader.wanted and master not in home.values()
    ]
    for master, _ in idle:
        del readers[master]
    return idle


class AsyncShardPulses(PulsesBase):
    """The asyncio node's readers on a cluster, one per master (see the module)."""

    def __init__(self, client: Any, router: PulseRouter[AsyncSignal]) -> None:
        self.router = router
        self._client = client
        self._readers: dict[str, AsyncPulses] = {}
        self._starts: dict[str, asyncio.Future[None]] = {}
        #: Channels whose first subscription is under way: later callers wait for it too.
        self._firsts: dict[str, asyncio.Future[None]] = {}
        #: Each wanted channel -> the master whose reader holds it.
        self._home: dict[str, str] = {}
        self._lost_links = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._rerouting = False
        #: Routing asked for again while a routing ran; masters whose links were lost since.
        self._reroute_due = False
        self._failed: set[str] = set()
        self._closed = False
        self._layout = async_layout(client)
        self._layout.on_dropped.append(self._dropped)

    @property
    def subscriptions(self) -> int:
        return len(self._home)

    @property
    def reconnects(self) -> int:
        return self._lost_links

    @property
    def links(self) -> int:
        """Pub/sub connections held: one per master that serves a wanted channel."""
        return len(self._readers)

    async def start(self) -> None:
        """Nothing to do yet: a reader starts with the first channel on its master."""

    async def ensure_subscribed(self, channel: str) -> None:
        """Subscribe on the master that serves `channel`; until the first subscription of it
        is confirmed (or the bounded wait for that ends), wait for it. Later calls wait for
        nothing: a channel being subscribed again (its master failing over, its slot moving)
        costs a poll, not a call's time."""
        home = self._home.get(channel)
        if home is not None:
            first = self._firsts.get(channel)
            if first is not None:
                await asyncio.shield(first)
                return
            reader = self._readers.get(home)
            if reader is None or channel not in reader.wanted:
                self._spawn(self._subscribe(channel, home))
            return
        home = _owner(self._client, channel)
        if home is None:
            logger.warning("no master serves the channel now; polling only channel=%s", channel)
            return
        self._home[channel] = home
        first = self._firsts[channel] = asyncio.ensure_future(self._subscribe(channel, home))
        first.add_done_callback(lambda _: self._firsts.pop(channel, None))
        await asyncio.shield(first)

    async def _subscribe(self, channel: str, home: str) -> None:
        await (await self._reader(home)).ensure_subscribed(channel)

    async def _reader(self, master: str) -> AsyncPulses:
        """The reader of `master`, started (once; concurrent callers wait for that start)."""
        reader = self._readers.get(master)
        if reader is None:
            reader = AsyncPulses(
                async_node_connector(self._client, master), self.router, sharded=True
            )
            reader._state.on_lost = lambda: self._lost(master)
            reader._state.on_moved = lambda channel: self._lost()
            self._readers[master] = reader
            self._starts[master] = asyncio.ensure_future(reader.start_quietly())
        started = self._starts[master]
        if not started.done():
            await asyncio.shield(started)
        return reader

    def _lost(self, master: str | None = None) -> None:
        """A reader lost its link to `master`, or the server moved a channel away: route
        again."""
        self._lost_links += 1
        if master is not None:
            self._failed.add(master)
        self._route_again()

    def _dropped(self, masters: set[str]) -> None:
        """The layout no longer names these masters (they failed): route their channels."""
        if not self._closed and self._readers.keys() & masters:
            self._route_again()

    def _route_again(self) -> None:
        if self._closed:
            return
        self._reroute_due = True
        if not self._rerouting:
            self._rerouting = True
            self._spawn(self._reroute())

    async def _reroute(self) -> None:
        try:
            while self._reroute_due and not self._closed:
                self._reroute_due = False
                failed, self._failed = self._failed, set()
                for master in failed:  # its connections dropped, the layout read without it
                    await self._layout.failed(master)
                if not failed:
                    await self._layout.refresh()  # else the last known
                await self._route()
        finally:
            self._rerouting = False

    async def _route(self) -> None:
        """Each channel to the master the layout names now; idle readers closed."""
        for channel, owner in _moves(self._client, self._home, self._readers):
            new = await self._reader(owner)
            self._spawn(new.ensure_subscribed(channel))
        for master, reader in _idle(self._home, self._readers):
            self._starts.pop(master, None)
            self._spawn(reader.aclose())

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        self._closed = True
        with contextlib.suppress(ValueError):
            self._layout.on_dropped.remove(self._dropped)
        for task in [*self._tasks, *self._starts.values(), *self._firsts.values()]:
            task.cancel()
        await asyncio.gather(
            *(reader.aclose() for reader in self._readers.values()), *self._tasks,
            return_exceptions=True,
        )  # fmt: skip
        self._readers.clear()


class ThreadShardPulses(PulsesBase):
    """The blocking node's readers on a cluster, one thread per master (see the module)."""

    def __init__(self, client: Any, router: PulseRouter[ThreadSignal]) -> None:
        self.router = router
        self._client = client
        self._readers: dict[str, ThreadPulses] = {}
        self._home: dict[str, str] = {}
        self._firsts: dict[str, threading.Event] = {}
        self._lost_links = 0
        self._lock = threading.RLock()
        #: Masters whose links were lost since the last routing (its own lock: a reader's
        #: thread adds to it while it may hold its own lock).
        self._failed: set[str] = set()
        self._failed_lock = threading.Lock()
        self._layout = sync_layout(client)
        self._layout.on_dropped.append(self._dropped)
        self._reroute_due = threading.Event()
        self._stop = threading.Event()
        self._router_thread: threading.Thread | None = None

    @property
    def subscriptions(self) -> int:
        return len(self._home)

    @property
    def reconnects(self) -> int:
        return self._lost_links

    @property
    def links(self) -> int:
        return len(self._readers)

    def start(self) -> None:
        """Start the thread that routes channels again after a loss (readers start later)."""
        self._router_thread = threading.Thread(
            target=self._route_loop, name="prq-pulses-router", daemon=True
        )
        self._router_thread.start()

    def ensure_subscribed(self, channel: str) -> None:
        """See AsyncShardPulses.ensure_subscribed."""
        with self._lock:
            home = self._home.get(channel)
            first = self._firsts.get(channel)
            if home is not None and first is None:
                self._reader(home).want(channel)
                return
            if home is None:
                home = _owner(self._client, channel)
                if home is None:
                    logger.warning(
                        "no master serves the channel now; polling only channel=%s", channel
                    )
                    return
                self._home[channel] = home
                first = self._firsts[channel] = threading.Event()
                reader: ThreadPulses | None = self._reader(home)
            else:
                reader = None  # another thread makes the first subscription: wait for it
        assert first is not None
        if reader is None:
            first.wait(FIRST_SUBSCRIBE_WAIT_S)
            return
        try:
            reader.ensure_subscribed(channel)
        finally:
            with self._lock:
                self._firsts.pop(channel, None)
            first.set()

    def _reader(self, master: str) -> ThreadPulses:
        reader = self._readers.get(master)
        if reader is None:
            reader = ThreadPulses(
                sync_node_connector(self._client, master), self.router, sharded=True
            )
            reader._state.on_lost = lambda: self._lost(master)
            reader._state.on_moved = lambda channel: self._lost()
            self._readers[master] = reader
            reader.start()
        return reader

    def _lost(self, master: str | None = None) -> None:
        # called on a reader's thread, maybe holding its lock: the routing is done elsewhere
        self._lost_links += 1
        if master is not None:
            with self._failed_lock:
                self._failed.add(master)
        self._reroute_due.set()

    def _dropped(self, masters: set[str]) -> None:
        """See AsyncShardPulses._dropped (called on the thread that read the layout)."""
        if self._readers.keys() & masters:
            self._reroute_due.set()

    def _route_loop(self) -> None:
        while not self._stop.is_set():
            if not self._reroute_due.wait(timeout=1.0):
                continue
            self._reroute_due.clear()
            if self._stop.is_set():
                return
            try:
                self._reroute()
            except Exception as exc:
                logger.debug("pub/sub rerouting failed error=%s", exc)

    def _reroute(self) -> None:
        idle: list[ThreadPulses] = []
        with self._failed_lock:
            failed, self._failed = self._failed, set()
        for master in failed:  # its connections dropped, the layout read without it
            self._layout.failed(master)
        if not failed:
            self._layout.refresh()  # else the last known
        with self._lock:
            for channel, owner in _moves(self._client, self._home, self._readers):
                self._reader(owner).want(channel)
            idle += [reader for _, reader in _idle(self._home, self._readers)]
        for reader in idle:
            reader.close()

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            self._layout.on_dropped.remove(self._dropped)
        self._stop.set()
        self._reroute_due.set()
        if self._router_thread is not None:
            self._router_thread.join(timeout=5)
        with self._lock:
            readers = list(self._readers.values())
            self._readers.clear()
        for reader in readers:
            with contextlib.suppress(Exception):
                reader.close()
