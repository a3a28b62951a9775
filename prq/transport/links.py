"""Links: the node's own command connection to Redis, one per queue object.

A link is not checked out of a pool per call: the batcher in redis_io.py sends pipelined round
trips on it, every reply read in order. On one server an asyncio link carries up to two round
trips at once (the second written while the first waits for its replies; the blocking link
carries one). Error replies come back in place (the stream stays in step); a transport error,
or a round trip cancelled half-way, drops the connection, so no later round trip can read an
earlier one's reply.

On a Redis Cluster a round trip whose calls all go to one node (the usual: one step for one
endpoint) is written straight to that node, on a connection of redis-py's pool for it; the
others, and the calls a node redirected, go as a redis-py cluster pipeline: redis-py groups
the calls by the node that owns each one's slot, sends one pipeline per node, and follows
MOVED, ASK and TRYAGAIN for the calls that got them. Replies come back raw, as from one
server (redis-py's reply parsers are taken off the commands prq sends), error replies in
place, and so are the connection failures of the nodes that could not be reached: the calls
to the other nodes are answered, and the retry policy sends only the failed steps again
(redis_io.StepBudgets) after redis-py has read the cluster's layout afresh. Round trips on a
cluster may overlap (each checks out connections of its own), so a step retried on a failing
shard does not hold up the steps for the others.

Every write on an asyncio connection goes through `send_packed`, which loses no cancel (see
`raise_if_cancelled`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import hiredis
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    MovedError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)

from prq.core.errors import QueueShutdown
from prq.protocol.effects import Call, Reply
from prq.protocol.scripts.loading import for_cluster

logger = logging.getLogger(__name__)

__all__ = [
    "AsyncClusterLink",
    "AsyncLink",
    "SyncClusterLink",
    "SyncLink",
    "async_link",
    "async_pubsub_connector",
    "sync_link",
    "sync_pubsub_connector",
]

#: Reply parsers redis-py itself needs on a cluster client (its layout discovery, connecting).
_KEPT_PARSERS = ("CLUSTER", "COMMAND", "CLIENT", "HELLO", "AUTH", "PING", "READONLY")
#: Commands about the servers rather than keys: sent to every primary of a cluster, and
#: answered with the one reply they all gave, or their replies joined (INFO: every server's
#: fields, so that a check of them sees each server's).
_EVERY_PRIMARY = ("SCRIPT", "INFO")
#: Replies of a node that did not run the command, and that redis-py's pipeline knows to follow.
_REDIRECTED = (MovedError, AskError, TryAgainError, ClusterDownError)
#: Failures of a cluster round trip that a retry after a fresh look at the layout can mend.
_CLUSTER_TRANSIENT = (
    redis.ConnectionError, redis.TimeoutError, ClusterDownError, SlotNotCoveredError,
    ClusterError,
)  # fmt: skip


def _cancels() -> int:
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0


def raise_if_cancelled(before: int) -> None:
    """Raise CancelledError if the current task was asked to cancel since it counted `before`
    (Task.cancelling()). redis-py writes under asyncio.wait_for, which on Python 3.11 returns
    normally when a cancel lands just as the write completes: the cancel would be lost, and a
    cancelled task (a `serve`, a call given up) would go on for ever."""
    if _cancels() > before:
        raise asyncio.CancelledError


def pack(commands: Sequence[Sequence[Any]]) -> bytes:
    """`commands` in RESP, encoded by hiredis's C packer (redis-py's asyncio connection packs in
    Python: ten times slower for a script call's thirty arguments, and a tenth of a busy
    sender's CPU)."""
    return b"".join([hiredis.pack_command(tuple(command)) for command in commands])


async def send_packed(conn: Any, commands: Sequence[Sequence[Any]]) -> None:
    """Write `commands` on a connected redis-py asyncio connection, losing no cancel (see
    raise_if_cancelled): a task cancelled during the write stops here.

    The bytes go to the connection's transport at once; only when the kernel did not take them
    all (a full socket buffer) does the write wait, under the socket timeout. (redis-py runs
    every write under asyncio.wait_for, which makes a task and a timer per round trip: a tenth
    of an idle receiver's CPU per call, for a wait that almost never happens.) The writer is
    the one the connection had when the write began: a round trip reading on the same
    connection that fails meanwhile drops it, and the wait then fails as a transport error
    instead of writing on whatever the connection holds next."""
    before = _cancels()
    data = pack(commands)
    writer = conn._writer if conn.is_connected else None
    if writer is None or writer.transport.is_closing():
        raise redis.ConnectionError("the connection to Redis is closed")
    writer.write(data)
    if writer.transport.get_write_buffer_size():
        try:
            async with asyncio.timeout(conn.socket_timeout):
                await writer.drain()
        except TimeoutError:
            raise redis.TimeoutError("Timeout writing to socket") from None
    raise_if_cancelled(before)


async def _exchange(conn: Any, calls: Sequence[Call]) -> list[Reply]:
    """One pipelined round trip on a redis-py asyncio connection: every reply read in order,
    error replies in place (CLUSTERDOWN too: redis-py does not count it a ResponseError)."""
    await conn.connect()
    await send_packed(conn, [call.args for call in calls])
    return await _read_replies(conn, len(calls))


async def _read_replies(conn: Any, count: int) -> list[Reply]:
    """`count` replies read in order, error replies in place."""
    replies: list[Reply] = []
    for _ in range(count):
        try:
            replies.append(await conn.read_response())
        except (ResponseError, ClusterDownError) as exc:
            replies.append(exc)
    return replies


def raw_replies(parsers: Any) -> None:
    """Take redis-py's reply parsers off everything prq sends: prq reads raw RESP3 replies."""
    for name in [n for n in parsers if not str(n).upper().startswith(_KEPT_PARSERS)]:
        del parsers[name]


#: What redis-py's cluster client itself may raise where a layout change confused it (redis-py
#: 8.1 follows an ASK to a node it does not know yet with an AttributeError on None): taken as
#: a connection failure, which a retry after a fresh look at the layout mends.
_CLIENT_SLIPS = (AttributeError, KeyError, IndexError, TypeError)


def _slip(exc: BaseException) -> redis.ConnectionError:
    logger.debug("cluster client failed; the layout is read again", exc_info=exc)
    return redis.ConnectionError(f"the cluster client failed on a layout change: {exc!r}")


def _mended(replies: list[Reply]) -> list[Reply]:
    return [_slip(r) if isinstance(r, _CLIENT_SLIPS) else r for r in replies]


def _first_key(call: Call) -> str | bytes | None:
    """The first key of a call prq sends (a script's first key; else the first argument)."""
    args = call.args
    if call.script is not None:
        return args[3] if len(args) > 3 and args[2] != 0 else None  # type: ignore[return-value]
    return args[1] if len(args) > 1 else None  # type: ignore[return-value]


def _first_failure(replies: Sequence[Reply]) -> BaseException | None:
    return next((r for r in replies if isinstance(r, _CLUSTER_TRANSIENT)), None)


def _per_server(calls: Sequence[Call]) -> list[int]:
    return [i for i, call in enumerate(calls) if str(call.args[0]).upper() in _EVERY_PRIMARY]


def _joined(replies: list[Reply]) -> Reply:
    error = next((r for r in replies if isinstance(r, Exception)), None)
    if error is not None:
        return error
    if all(r == replies[0] for r in replies):
        return replies[0]
    if all(isinstance(r, bytes) for r in replies):
        return b"\r\n".join(r for r in replies if isinstance(r, bytes))
    return replies[0]


class AsyncLink:
    """The node's command connection, owned (not checked out per call). Round trips are
    pipelined on it: each is written at once, and reads its replies when the one written
    before it has read its own (Redis answers one connection's commands in order), so Redis
    runs one batch while the node reads and acts on the previous one. A round trip that fails
    or is cancelled after writing drops the connection: the round trips written after it on
    the same connection fail unread (their outcome is indeterminate, as for any transport
    error, and the batcher retries them), and no later round trip can read an earlier one's
    reply."""

    def __init__(self, pool: redis.asyncio.ConnectionPool) -> None:
        self._pool = pool
        # redis-py's connection classes are only partly typed; this stays internal.
        self._conn: Any = None
        #: Which connection a round trip wrote on: a new one after each drop.
        self._epoch = 0
        self._broken = False
        #: Done when the round trip written last, and every one before it, has ended.
        self._last: asyncio.Future[None] | None = None
        self._connecting = asyncio.Lock()

    async def round_trip(self, calls: Sequence[Call]) -> list[Reply]:
        conn = self._conn
        if conn is None:
            conn = self._conn = self._pool.make_connection()  # type: ignore[no-untyped-call]
        # (A connection counts as connected while redis-py still reads its handshake: no round
        # trip may write before the connect is over.)
        while self._broken or not conn.is_connected or self._connecting.locked():
            last = self._last
            if last is not None and not last.done():
                # (re)connect only once every round trip written before has ended: none may
                # still be reading when the connection's reader is replaced
                await asyncio.shield(last)
                continue
            async with self._connecting:
                if self._broken:
                    self._broken = False
                    await conn.disconnect(nowait=True)
                if not conn.is_connected:
                    await conn.connect()
        # From here to the write nothing waits: round trips read in the order they write.
        epoch = self._epoch
        before = self._last
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._last = turn
        try:
            await send_packed(conn, [call.args for call in calls])
            if before is not None and not before.done():
                await asyncio.shield(before)
            if self._epoch != epoch:
                raise redis.ConnectionError("the connection dropped before the replies came")
            return await _read_replies(conn, len(calls))
        except BaseException:
            if self._epoch == epoch:  # replies of this round trip may be left unread
                self._epoch += 1
                self._broken = True
            raise
        finally:
            # turns end in the order they were taken, whichever round trip fails first
            if before is None or before.done():
                turn.set_result(None)
            else:
                before.add_done_callback(lambda _: turn.set_result(None))

    async def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.disconnect(nowait=True)


class SyncLink:
    """The blocking twin of AsyncLink (used by one batch leader at a time). Once closed it
    connects no more: a round trip sent then (a retry of one that met the close, say) raises
    QueueShutdown instead of leaving a connection open behind the closed queue."""

    def __init__(self, pool: redis.ConnectionPool) -> None:
        self._pool = pool
        self._conn: Any = None
        self._closed = False

    def round_trip(self, calls: Sequence[Call]) -> list[Reply]:
        if self._closed:
            raise QueueShutdown("the queue was closed while talking to Redis")
        conn = self._conn
        if conn is None:
            conn = self._conn = self._pool.make_connection()
        try:
            conn.connect()
            if self._closed:  # (closed while connecting: its disconnect may have come first)
                raise QueueShutdown("the queue was closed while talking to Redis")
            conn.send_packed_command([pack([call.args for call in calls])], check_health=False)
            replies: list[Reply] = []
            for _ in calls:
                try:
                    replies.append(conn.read_response())
                except ResponseError as exc:
                    replies.append(exc)
            return replies
        except BaseException:
            conn.disconnect()
            raise
        finally:
            if self._closed:  # (redis-py's send connects afresh if the close came just before)
                conn.disconnect()

    def close(self) -> None:
        self._closed = True
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.disconnect()


class AsyncClusterLink:
    """A round trip on a Redis Cluster: one redis-py cluster pipeline (see the module). A
    round trip whose calls all go to one node (the usual: one step, one endpoint) goes straight
    to that node instead, on a connection of the cluster client's pool for it, as on one
    server; the calls it redirects (MOVED, ASK, TRYAGAIN, CLUSTERDOWN: none of them ran) go
    again through the pipeline, which follows the redirections."""

    def __init__(self, client: redis.asyncio.cluster.RedisCluster) -> None:
        self._client = client
        raw_replies(client.response_callbacks)
        #: The connections direct round trips used, closed by `close`.
        self._used: weakref.WeakSet[Any] = weakref.WeakSet()
        self._closed = False
        #: A direct round trip failed: the next ones go through the pipeline, which reads the
        #: layout afresh, until one completes.
        self._stale = False

    async def round_trip(self, calls: Sequence[Call]) -> list[Reply]:
        before = _cancels()
        replies = await self._round_trip([for_cluster(call) for call in calls])
        raise_if_cancelled(before)  # redis-py's own writes may have lost a cancel
        return replies

    async def _round_trip(self, calls: Sequence[Call]) -> list[Reply]:
        special = _per_server(calls)
        keyed = [call for i, call in enumerate(calls) if i not in special]
        replies: list[Reply] = []
        if keyed:
            nodes = [self._node_for(call) for call in keyed]
            first = nodes[0]
            if not self._stale and first is not None and all(node is first for node in nodes):
                replies = await self._direct(first, keyed)
            else:
                replies = await self._pipeline(keyed, nodes)
                self._stale = False
        if _first_failure(replies) is not None:
            await self._client.aclose()  # the next round trip reads the layout afresh
        if special:
            await self._client.initialize()
        for i in special:
            primaries = self._client.get_primaries()
            replies.insert(i, _joined([await self._on(node, calls[i]) for node in primaries]))
        return replies

    async def _pipeline(self, calls: Sequence[Call], nodes: Sequence[Any]) -> list[Reply]:
        pipe = self._client.pipeline(transaction=False)
        for call, node in zip(calls, nodes, strict=True):
            if node is None:
                pipe.execute_command(*call.args)
            else:
                pipe.execute_command(*call.args, target_nodes=node)
        try:
            return _mended(await pipe.execute(raise_on_error=False))
        except _CLUSTER_TRANSIENT:  # no node reached (or the layout could not be read)
            await self._client.aclose()
            raise
        except _CLIENT_SLIPS as exc:
            await self._client.aclose()
            raise _slip(exc) from exc

    async def _direct(self, node: Any, calls: Sequence[Call]) -> list[Reply]:
        """The calls on one connection of the node's own pool (the cluster client's), read in
        order. A round trip that fails or is cancelled half-way leaves its connection marked:
        the pool drops it before anyone uses it again, so no later round trip can read this
        one's replies."""
        if self._closed:
            raise QueueShutdown("the queue was closed while talking to Redis")
        conn = node.acquire_connection()
        self._used.add(conn)
        try:
            replies = await _exchange(conn, calls)
        except BaseException as exc:
            # Closed here, not by the pool's task for it (which a closing event loop may never
            # run); marked first, so that the pool drops it should this close not finish.
            conn.mark_for_reconnect()
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)
            slipped = isinstance(exc, _CLIENT_SLIPS)  # e.g. its socket closed under it by
            if slipped or isinstance(exc, _CLUSTER_TRANSIENT):  # a layout refresh meanwhile
                self._stale = True
                await self._client.aclose()
            if slipped:
                raise _slip(exc) from exc
            raise
        finally:
            if self._closed:  # closed while this round trip ran: nothing may reopen it
                with contextlib.suppress(Exception):
                    await conn.disconnect(nowait=True)
            node.release(conn)
        moved = [i for i, reply in enumerate(replies) if isinstance(reply, _REDIRECTED)]
        if moved:  # none of these ran: the pipeline sends them again, following redis-py
            again = await self._pipeline([calls[i] for i in moved], [None] * len(moved))
            for i, reply in zip(moved, again, strict=True):
                replies[i] = reply
        return replies

    def _node_for(self, call: Call) -> Any:
        """The primary that serves the call's slot, from redis-py's slot table, named here so
        that redis-py's pipeline does not work the slot out of every key of every call (all
        the keys of one prq call share a hash tag: the first names the slot). None: let
        redis-py route it. Redirections are still redis-py's to follow."""
        key = _first_key(call)
        if key is None:
            return None
        try:
            return self._client.nodes_manager.get_node_from_slot(self._client.keyslot(key))
        except SlotNotCoveredError:
            return None

    async def _on(self, node: Any, call: Call) -> Reply:
        try:
            return await self._client.execute_command(*call.args, target_nodes=node)  # type: ignore[no-any-return]
        except (ResponseError, *_CLUSTER_TRANSIENT) as exc:
            if isinstance(exc, _CLUSTER_TRANSIENT):
                await self._client.aclose()
            return exc
        except _CLIENT_SLIPS as exc:
            await self._client.aclose()
            return _slip(exc)

    async def close(self) -> None:
        """Close every connection a direct round trip used (they are the cluster client's,
        which closes the nodes it still knows; a node the layout dropped meanwhile is closed
        here, not by a task of redis-py's that a closing event loop may never run)."""
        self._closed = True
        for conn in list(self._used):
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)


class SyncClusterLink:
    """The blocking twin of AsyncClusterLink."""

    def __init__(self, client: redis.cluster.RedisCluster) -> None:
        # redis-py's blocking cluster client is only partly typed; this stays internal.
        self._client: Any = client

    def round_trip(self, calls: Sequence[Call]) -> list[Reply]:
        for node in self._client.get_nodes():
            if node.redis_connection is not None:
                raw_replies(node.redis_connection.response_callbacks)
        calls = [for_cluster(call) for call in calls]
        special = _per_server(calls)
        keyed = [call for i, call in enumerate(calls) if i not in special]
        replies: list[Reply] = []
        if keyed:
            try:
                pipe = self._client.pipeline(transaction=False)
                for call in keyed:
                    pipe.execute_command(*call.args, target_nodes=self._node_for(call))
                replies = _mended(pipe.execute(raise_on_error=False))
            except _CLUSTER_TRANSIENT:  # no node reached (or the layout could not be read)
                self._refresh()
                raise
            except _CLIENT_SLIPS as exc:
                self._refresh()
                raise _slip(exc) from exc
        if _first_failure(replies) is not None:
            self._refresh()
        for i in special:
            primaries = self._client.get_primaries()
            replies.insert(i, _joined([self._on(node, calls[i]) for node in primaries]))
        return replies

    def _on(self, node: Any, call: Call) -> Reply:
        try:
            return self._client.execute_command(*call.args, target_nodes=node)  # type: ignore[no-any-return]
        except (ResponseError, *_CLUSTER_TRANSIENT) as exc:
            if isinstance(exc, _CLUSTER_TRANSIENT):
                self._refresh()
            return exc
        except _CLIENT_SLIPS as exc:
            self._refresh()
            return _slip(exc)

    def _node_for(self, call: Call) -> Any:
        """The primary that owns the call's slot, from redis-py's slot table. Named here
        because redis-py's blocking pipeline would otherwise ask the server (COMMAND GETKEYS,
        one more round trip) where the keys of each EVALSHA are; its own slot function reads
        them from the arguments. Redirections are still redis-py's to follow."""
        slot = self._client.determine_slot(*call.args)
        return self._client.nodes_manager.get_node_from_slot(slot)

    def _refresh(self) -> None:
        """Read the cluster's layout afresh (at the next round trip if no node answers now)."""
        with contextlib.suppress(Exception):
            self._client.nodes_manager.initialize()

    def close(self) -> None:
        """Nothing of its own: the connections are the cluster client's."""


def async_link(client: Any) -> AsyncLink | AsyncClusterLink:
    """The command link for an asyncio client of prq.transport.topology (one server or a
    cluster)."""
    if isinstance(client, redis.asyncio.cluster.RedisCluster):
        return AsyncClusterLink(client)
    return AsyncLink(client.connection_pool)


def sync_link(client: Any) -> SyncLink | SyncClusterLink:
    """The command link for a blocking client of prq.transport.topology (one server or a
    cluster)."""
    if isinstance(client, redis.cluster.RedisCluster):
        return SyncClusterLink(client)
    return SyncLink(client.connection_pool)


def shard_layout(client: Any) -> dict[str, list[int]] | None:
    """A cluster's primaries and the slots each serves, from the slot table the client keeps
    (redis-py refreshes it on MOVED and on connection errors); None for one server."""
    manager = getattr(client, "nodes_manager", None)
    if manager is None:
        return None
    for _ in range(3):  # the table may be rewritten while it is read
        layout: dict[str, list[int]] = {}
        try:
            for slot, nodes in list(manager.slots_cache.items()):
                if nodes:
                    layout.setdefault(nodes[0].name, []).append(slot)
        except RuntimeError:
            continue
        return layout
    return {}


def async_pubsub_connector(client: Any) -> Callable[[], Awaitable[Any]]:
    """Makes the (unconnected) connection a node's pub/sub reader uses on one server, afresh
    after each loss (a cluster has a reader per master: async_node_connector)."""
    pool = client.connection_pool

    async def from_pool() -> Any:
        return pool.make_connection()

    return from_pool


def sync_pubsub_connector(client: Any) -> Callable[[], Any]:
    """The blocking twin of async_pubsub_connector."""
    return client.connection_pool.make_connection  # type: ignore[no-any-return]


def async_node_connector(client: Any, name: str) -> Callable[[], Awaitable[Any]]:
    """Makes a pub/sub connection to the cluster node `name` (host:port), with the cluster
    client's credentials and TLS; a ConnectionError once the client no longer knows it."""

    async def to_node() -> Any:
        node = client.get_node(node_name=name)
        if node is None:
            raise redis.exceptions.ConnectionError(f"cluster node {name} is gone from the layout")
        return node.connection_class(**node.connection_kwargs)

    return to_node


def sync_node_connector(client: Any, name: str) -> Callable[[], Any]:
    """The blocking twin of async_node_connector."""

    def to_node() -> Any:
        node = client.get_node(node_name=name)
        if node is None:
            raise redis.exceptions.ConnectionError(f"cluster node {name} is gone from the layout")
        if node.redis_connection is None:
            client.nodes_manager.initialize()
            node = client.get_node(node_name=name)
        if node is None or node.redis_connection is None:
            raise redis.exceptions.ConnectionError(f"cluster node {name} is gone from the layout")
        return node.redis_connection.connection_pool.make_connection()

    return to_node
