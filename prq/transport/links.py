"""Links: the node's own command connection to Redis, one per queue object.

A link is not checked out of a pool per call: the batcher (prq.transport.async_io,
prq.transport.sync_io) sends pipelined round trips on it, every reply read in order. On one
server an asyncio link carries up to two round trips at once (the second written while the
first waits for its replies; the blocking link carries one). Error replies come back in place
(the stream stays in step); a transport error, or a round trip cancelled half-way, drops the
connection, so no later round trip can read an earlier one's reply.

A Redis Cluster has links of its own (prq.transport.cluster_links); `async_link` and
`sync_link` pick the one a client needs. Every write on an asyncio connection goes through
prq.transport.wire.send_packed, which loses no cancel.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.exceptions import ResponseError

from prq.core.errors import QueueShutdown
from prq.protocol.effects import Call, Reply
from prq.transport.cluster_links import AsyncClusterLink
from prq.transport.sync_cluster_links import SyncClusterLink
from prq.transport.wire import _read_replies, pack, send_packed

__all__ = ["AsyncLink", "SyncLink", "async_link", "sync_link"]


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
