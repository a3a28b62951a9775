"""Cluster links: the node's command round trips on a Redis Cluster.

The asyncio link writes each node's calls of a round trip straight to that node, on a
connection of redis-py's pool for it (the nodes of one round trip at once); the blocking link
sends a redis-py cluster pipeline with the node of each call named (one pipeline per node,
written to all before any is read). The calls a node redirected (MOVED, ASK, TRYAGAIN,
CLUSTERDOWN), and those of no known node, go through redis-py's pipeline, which follows the
redirections. Replies come back raw, as from one server (redis-py's reply parsers are taken off
the commands prq sends), error replies in place, and so are the connection failures of the
nodes that could not be reached: the calls to the other nodes are answered, and the retry
policy sends only the failed steps again (prq.transport.budgets.StepBudgets). A node that could
not be reached has its own connections dropped, no other's, and the layout is read again
(prq.transport.cluster_layout): the round trips in flight to the other nodes complete. Round
trips on a cluster may overlap (each checks out connections of its own), so a step retried on
a failing shard does not hold up the steps for the others. (One server's links:
prq.transport.links; the blocking cluster link: prq.transport.sync_cluster_links.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Sequence
from typing import Any

import redis
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
from prq.transport.cluster_layout import async_layout
from prq.transport.wire import _cancels, _exchange, raise_if_cancelled

logger = logging.getLogger(__name__)

__all__ = ["AsyncClusterLink"]


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


class AsyncClusterLink:
    """A round trip on a Redis Cluster (see the module). Its calls for each node go straight to
    that node, on a connection of the cluster client's pool for it (the nodes of one round trip
    at once); the calls it redirects (MOVED, ASK, TRYAGAIN, CLUSTERDOWN: none of them ran), and
    those of no known node, go through the pipeline, which follows the redirections. A node
    that cannot be reached fails its own calls alone (prq.transport.cluster_layout)."""

    def __init__(self, client: redis.asyncio.cluster.RedisCluster) -> None:
        self._client = client
        raw_replies(client.response_callbacks)
        self._layout = async_layout(client)
        #: The connections direct round trips used, closed by `close`.
        self._used: weakref.WeakSet[Any] = weakref.WeakSet()
        self._closed = False

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
            if self._layout.any_suspect(node.name for node in nodes if node is not None):
                self._layout.shun()
                await self._layout.refresh()  # not to a node that failed, if another serves now
                nodes = [self._node_for(call) for call in keyed]
                for node in nodes:
                    self._layout.saw(node)
            replies = await self._keyed(keyed, nodes)
        if special:
            await self._client.initialize()  # (the first round trip: the layout not read yet)
        for i in special:
            primaries = self._client.get_primaries()
            replies.insert(i, _joined([await self._on(node, calls[i]) for node in primaries]))
        return replies

    async def _keyed(self, calls: Sequence[Call], nodes: Sequence[Any]) -> list[Reply]:
        """Each node's calls straight to it, the nodes at once. One node: its failure raises,
        as on one server; several: a node that cannot be reached fails its own calls in place
        (the others are answered), unless none could be reached."""
        groups = _groups(nodes)
        if len(groups) == 1 and None not in groups:
            return await self._direct(nodes[0], calls)
        parts = await asyncio.gather(
            *(
                self._pipeline([calls[i] for i in at], [None] * len(at))
                if name is None
                else self._direct(nodes[at[0]], [calls[i] for i in at])
                for name, at in groups.items()
            ),
            return_exceptions=True,
        )
        replies: list[Reply] = [None] * len(calls)
        failures = [p for p in parts if isinstance(p, BaseException)]
        for failure in failures:
            if not isinstance(failure, _CLUSTER_TRANSIENT) or len(failures) == len(parts):
                raise failure
        for at, part in zip(groups.values(), parts, strict=True):
            for n, i in enumerate(at):
                replies[i] = part if isinstance(part, Exception) else part[n]  # type: ignore[index]
        return replies

    async def _pipeline(self, calls: Sequence[Call], nodes: Sequence[Any]) -> list[Reply]:
        pipe = self._client.pipeline(transaction=False)
        for call, node in zip(calls, nodes, strict=True):
            if node is None:
                pipe.execute_command(*call.args)
            else:
                pipe.execute_command(*call.args, target_nodes=node)
        try:
            replies = _mended(await pipe.execute(raise_on_error=False))
        except _CLUSTER_TRANSIENT:  # no node reached (or the layout could not be read)
            await self._layout.failed(None)
            raise
        except _CLIENT_SLIPS as exc:
            await self._layout.failed(None)
            raise _slip(exc) from exc
        if _first_failure(replies) is not None:  # (a node redis-py chose: not known here)
            await self._layout.failed(None)
        return replies

    async def _direct(self, node: Any, calls: Sequence[Call]) -> list[Reply]:
        """The calls on one connection of the node's own pool (the cluster client's), read in
        order. A round trip that fails or is cancelled half-way leaves its connection marked:
        the pool drops it before anyone uses it again, so no later round trip can read this
        one's replies. A node that cannot be reached has its own connections dropped, no
        other's (prq.transport.cluster_layout)."""
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
                await self._layout.failed(node.name)
            if slipped:
                raise _slip(exc) from exc
            raise
        finally:
            if self._closed:  # closed while this round trip ran: nothing may reopen it
                with contextlib.suppress(Exception):
                    await conn.disconnect(nowait=True)
            node.release(conn)
        self._layout.answered(node.name)
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
        except (SlotNotCoveredError, KeyError):  # (KeyError: the layout not read yet)
            return None

    async def _on(self, node: Any, call: Call) -> Reply:
        try:
            reply = await self._client.execute_command(*call.args, target_nodes=node)
        except (ResponseError, *_CLUSTER_TRANSIENT) as exc:
            if isinstance(exc, _CLUSTER_TRANSIENT):
                await self._layout.failed(node.name)
            return exc
        except _CLIENT_SLIPS as exc:
            await self._layout.failed(node.name)
            return _slip(exc)
        self._layout.answered(node.name)
        return reply  # type: ignore[no-any-return]

    async def close(self) -> None:
        """Close every connection a direct round trip used (they are the cluster client's,
        which closes the nodes it still knows; a node the layout dropped meanwhile is closed
        here, not by a task of redis-py's that a closing event loop may never run), and stop
        reading the layout."""
        self._closed = True
        for conn in list(self._used):
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)
        await self._layout.aclose()


def _groups(nodes: Sequence[Any]) -> dict[str | None, list[int]]:
    """The indexes of the calls for each node, by its name (None: no node known)."""
    groups: dict[str | None, list[int]] = {}
    for i, node in enumerate(nodes):
        groups.setdefault(None if node is None else str(node.name), []).append(i)
    return groups
