"""Cluster layouts: which master serves which slot, as redis-py's NodesManager keeps it for a
node's cluster client, read again when a node fails, with that node's connections alone dropped.

One layout per cluster client, shared by the command link (prq.transport.cluster_links) and the
pub/sub readers (prq.transport.shard_pulses): `async_layout(client)`, `sync_layout(client)`.

- A node that could not be reached (a connect, a write or a read failed or timed out) is
  `failed`: its connections are dropped (redis-py's own per-node calls: the idle ones closed,
  the ones in use closed once released), it is moved to the end of the nodes redis-py asks
  first, and the layout is read again from the others (NodesManager.initialize, the failed node
  asked last). The other nodes keep their connections: their round trips in flight complete,
  and are not retried. (redis-py's asyncio NodesManager marks every node's connections to be
  made again when it reads the layout: each once its command is done, so nothing in flight is
  cut.)
- The node stays *suspect* while the layout still names it (a master killed, no replica
  promoted yet) and until it answers again. Before anything goes to a suspect node (a round
  trip, a pub/sub connection) the layout is read again (unless it was just read), and while
  there are suspects it is read every LAYOUT_POLL_S: once a replica is promoted, nothing is sent
  to the dead address any more, and the connections still open to a suspect the layout no
  longer names, in use or not, are closed, so that nothing (a close, a call) waits on them
  (and again at each reading for DROPPED_S: a round trip routed by the layout before may
  connect to it just after). The pub/sub readers hear of such a node through `on_dropped` and
  route its channels again.
- A suspect node is kept out of the startup nodes redis-py reads the layout from when it does
  so by itself (it shuffles them, and asks the one that just failed last only when told which):
  a node that does not answer would hold every reading of the layout up for a socket timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["LAYOUT_POLL_S", "AsyncLayout", "SyncLayout", "async_layout", "sync_layout"]

logger = logging.getLogger(__name__)

#: While a node that failed is still named by the layout, the layout is read this often.
LAYOUT_POLL_S = 0.5
#: A layout read this recently is not read again before a round trip to a suspect node.
REFRESH_GAP_S = 0.05
#: How long the connections to a failed node the layout dropped are closed again at each read.
DROPPED_S = 2.0

_async_layouts: weakref.WeakKeyDictionary[Any, AsyncLayout] = weakref.WeakKeyDictionary()
_sync_layouts: weakref.WeakKeyDictionary[Any, SyncLayout] = weakref.WeakKeyDictionary()


def async_layout(client: Any) -> AsyncLayout:
    """The layout of an asyncio cluster client (one per client)."""
    layout = _async_layouts.get(client)
    if layout is None:
        layout = _async_layouts[client] = AsyncLayout(client)
    return layout


def sync_layout(client: Any) -> SyncLayout:
    """The layout of a blocking cluster client (one per client)."""
    layout = _sync_layouts.get(client)
    if layout is None:
        layout = _sync_layouts[client] = SyncLayout(client)
    return layout


class _Layout:
    """What both layouts keep: the suspect nodes (name -> every node object redis-py had for
    it and a round trip went to: each has connections of its own) and when the layout was last
    read."""

    def __init__(self, client: Any) -> None:
        # (weakly: the layouts are kept by client in a WeakKeyDictionary)
        self._client = weakref.ref(client)
        self._suspects: dict[str, list[Any]] = {}
        #: Failed nodes the layout dropped -> (their node objects, until when their connections
        #: are closed).
        self._dropped: dict[str, tuple[list[Any], float]] = {}
        self._read_at = -REFRESH_GAP_S
        self._closed = False
        #: Called with the names of suspect nodes the layout no longer names.
        self.on_dropped: list[Callable[[set[str]], None]] = []

    @property
    def manager(self) -> Any:
        client = self._client()
        if client is None:
            raise RuntimeError("the cluster client is gone")
        return client.nodes_manager

    def suspect(self, name: str) -> bool:
        return name in self._suspects

    def any_suspect(self, names: Iterable[str]) -> bool:
        return any(name in self._suspects for name in names)

    def answered(self, name: str) -> None:
        """`name` answered a round trip: it is not suspect any more."""
        self._suspects.pop(name, None)

    def _suspected(self, name: str) -> bool:
        """Note `name` as suspect (False once closed)."""
        self.manager.move_node_to_end_of_cached_nodes(name)
        if self._closed:
            return False
        self._suspects.setdefault(name, [])
        self.saw(self.manager.get_node(node_name=name))
        self.shun()
        return True

    def saw(self, node: Any) -> None:
        """A round trip goes to `node`: if it is suspect, its connections are the ones to close
        should the layout drop it."""
        seen = None if node is None else self._suspects.get(node.name)
        if seen is not None and not any(known is node for known in seen):
            seen.append(node)

    def shun(self) -> None:
        """Keep the suspect nodes out of redis-py's startup nodes (a reading of the layout puts
        back every node it names); one is always left."""
        startup = self.manager.startup_nodes
        for name in list(self._suspects):
            if name in startup and len(startup) > 1:
                self.saw(startup.pop(name, None))  # (its connections closed with the others)

    def _known(self) -> list[Any]:
        """Every node object noted for a failed node (closed with the layout: the client closes
        only the nodes it still has)."""
        nodes = [node for seen in self._suspects.values() for node in seen]
        return nodes + [node for seen, _ in self._dropped.values() for node in seen]

    def _fresh(self) -> bool:
        return time.monotonic() - self._read_at < REFRESH_GAP_S

    def _last_failed(self) -> str | None:
        return next(iter(self._suspects), None)

    def _gone(self) -> tuple[set[str], list[Any]]:
        """The suspects the layout no longer names (taken off the suspects; whoever read it,
        prq or redis-py itself), and every node object whose connections are to be closed now."""
        cache = self._named()
        gone = {name for name in self._suspects if name not in cache}
        now = time.monotonic()
        for name in gone:
            self._dropped[name] = (self._suspects.pop(name), now + DROPPED_S)
        for name, (_, until) in list(self._dropped.items()):
            if until < now or name in cache:
                del self._dropped[name]
        return gone, [node for nodes, _ in self._dropped.values() for node in nodes]

    def _named(self) -> set[str]:
        """The nodes the slot table names (each object for a suspect noted: see `saw`). (Not
        the nodes' table: redis-py moves a node that failed to its end by taking it out and
        putting it back, and another thread may look between the two.)"""
        for _ in range(3):  # the table may be rewritten while it is read
            try:
                lists = {id(nodes): nodes for nodes in list(self.manager.slots_cache.values())}
            except RuntimeError:
                continue
            named = set()
            for nodes in lists.values():
                for node in nodes:
                    named.add(node.name)
                    self.saw(node)  # (redis-py makes node objects anew at each reading)
            return named
        return set(self.manager.nodes_cache)

    @property
    def _watching(self) -> bool:
        alive = self._client() is not None
        return bool(self._suspects or self._dropped) and alive and not self._closed

    def _tell_dropped(self, gone: set[str]) -> None:
        if gone:
            logger.info(
                "cluster nodes left the layout; their connections closed nodes=%s", sorted(gone)
            )
        for callback in list(self.on_dropped):
            try:
                callback(set(gone))
            except Exception as exc:  # a listener must not stop the layout's reading
                logger.debug("layout listener failed error=%s", exc)


class AsyncLayout(_Layout):
    """The layout of an asyncio cluster client (see the module)."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self._poller: asyncio.Task[None] | None = None

    async def failed(self, name: str | None) -> None:
        """`name` could not be reached (None: a node redis-py chose): drop its connections
        alone, and read the layout again."""
        if name is not None:
            node = self.manager.get_node(node_name=name)
            if node is not None:  # redis-py's own handling of a failed node
                node.update_active_connections_for_reconnect()
                with contextlib.suppress(Exception):
                    await node.disconnect_free_connections()
            if self._suspected(name):
                self._poll()
        await self.refresh()

    async def settle(self, names: Iterable[str]) -> None:
        """Before a round trip to `names`: read the layout again if one of them is suspect."""
        if self.any_suspect(names):
            await self.refresh()

    async def refresh(self) -> None:
        """Read the layout again (unless it was just read); close what is left open to a
        suspect node it no longer names. A layout that cannot be read leaves the last one."""
        if not self._fresh():
            try:
                await self.manager.initialize(last_failed_node_name=self._last_failed())
            except Exception as exc:
                logger.debug("cluster layout not read error=%s", exc)
            finally:
                self._read_at = time.monotonic()
        gone, closed = self._gone()
        self.shun()
        for node in closed:
            with contextlib.suppress(Exception):
                await node.disconnect()
        if gone:
            self._tell_dropped(gone)

    def _poll(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._polling())

    async def _polling(self) -> None:
        while self._watching:
            await asyncio.sleep(LAYOUT_POLL_S)  # the period of the reading, not a wait for it
            await self.refresh()

    async def aclose(self) -> None:
        self._closed = True
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(BaseException):
                await self._poller
        for node in self._known():
            with contextlib.suppress(Exception):
                await node.disconnect()
        self._suspects.clear()
        self._dropped.clear()


class SyncLayout(_Layout):
    """The blocking twin of AsyncLayout: its reading while there are suspects is a daemon
    thread's."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None

    def failed(self, name: str | None) -> None:
        """See AsyncLayout.failed."""
        if name is not None:
            node = self.manager.get_node(node_name=name)
            pool = getattr(getattr(node, "redis_connection", None), "connection_pool", None)
            if pool is not None:  # redis-py's own handling of a failed node
                pool.update_active_connections_for_reconnect()
                pool.disconnect_free_connections()
            with self._lock:
                if self._suspected(name):
                    self._poll()
        self.refresh()

    def settle(self, names: Iterable[str]) -> None:
        """See AsyncLayout.settle."""
        if self.any_suspect(names):
            self.refresh()

    def refresh(self) -> None:
        """See AsyncLayout.refresh."""
        if not self._fresh():
            try:
                self.manager.initialize(last_failed_node_name=self._last_failed())
            except Exception as exc:
                logger.debug("cluster layout not read error=%s", exc)
            finally:
                self._read_at = time.monotonic()
        with self._lock:
            gone, closed = self._gone()
            self.shun()
        for node in closed:
            redis_connection = getattr(node, "redis_connection", None)
            if redis_connection is not None:
                with contextlib.suppress(Exception):
                    redis_connection.connection_pool.disconnect()  # in use too
        if gone:
            self._tell_dropped(gone)

    def _poll(self) -> None:
        if self._poller is None or not self._poller.is_alive():
            self._poller = threading.Thread(
                target=self._polling, name="prq-cluster-layout", daemon=True
            )
            self._poller.start()

    def _polling(self) -> None:
        while not self._stop.wait(LAYOUT_POLL_S):
            with self._lock:
                if not self._watching:
                    self._poller = None
                    return
            try:
                self.refresh()
            except Exception as exc:
                logger.debug("cluster layout not read error=%s", exc)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            known = self._known()
            self._suspects.clear()
            self._dropped.clear()
        self._stop.set()
        for node in known:
            redis_connection = getattr(node, "redis_connection", None)
            if redis_connection is not None:
                with contextlib.suppress(Exception):
                    redis_connection.connection_pool.disconnect()
