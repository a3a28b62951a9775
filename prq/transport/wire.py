"""The wire: prq's commands written as RESP on a redis-py connection, and their replies read.

Every write on an asyncio connection goes through `send_packed`, which packs with hiredis (C)
and loses no cancel (see `raise_if_cancelled`); replies are read in order, error replies in
place, so that a connection's stream stays in step. Used by the links (prq.transport.links,
prq.transport.cluster_links) and the pub/sub readers (prq.transport.pulses).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import hiredis
import redis
from redis.exceptions import ClusterDownError, ResponseError

from prq.protocol.effects import Call, Reply

__all__ = ["pack", "raise_if_cancelled", "send_packed"]


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
