"""Links: the node's own command connection to Redis, one per queue object.

A link is not checked out of a pool per call: the batcher in redis_io.py sends one pipelined
round trip at a time on it, reading every reply in order. Error replies come back in place
(the stream stays in step); a transport error, or a round trip cancelled half-way, drops the
connection, so no later round trip can read an earlier one's reply.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio
from redis.exceptions import ResponseError

from prq._types import Call, Reply

__all__ = ["AsyncLink", "SyncLink"]


class AsyncLink:
    """The node's command connection, owned (not checked out per call): the batcher sends one
    pipelined round trip at a time on it. A round trip that fails or is cancelled half-way
    drops the connection, so no later caller can read an earlier caller's reply."""

    def __init__(self, pool: redis.asyncio.ConnectionPool) -> None:
        self._pool = pool
        # redis-py's connection classes are only partly typed; this stays internal.
        self._conn: Any = None
        self._broken = False

    async def round_trip(self, calls: Sequence[Call]) -> list[Reply]:
        conn = self._conn
        if conn is None:
            conn = self._conn = self._pool.make_connection()  # type: ignore[no-untyped-call]
        if self._broken:
            await conn.disconnect(nowait=True)
            self._broken = False
        self._broken = True  # until every reply of this round trip is read
        await conn.connect()
        await conn.send_packed_command(
            conn.pack_commands([call.args for call in calls]), check_health=False
        )
        replies: list[Reply] = []
        for _ in calls:
            try:
                replies.append(await conn.read_response())
            except ResponseError as exc:
                replies.append(exc)
        self._broken = False
        return replies

    async def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.disconnect(nowait=True)


class SyncLink:
    """The blocking twin of AsyncLink (used by one batch leader at a time)."""

    def __init__(self, pool: redis.ConnectionPool) -> None:
        self._pool = pool
        self._conn: Any = None

    def round_trip(self, calls: Sequence[Call]) -> list[Reply]:
        conn = self._conn
        if conn is None:
            conn = self._conn = self._pool.make_connection()
        try:
            conn.connect()
            conn.send_packed_command(
                conn.pack_commands([call.args for call in calls]), check_health=False
            )
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

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.disconnect()
