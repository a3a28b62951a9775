"""Cluster links: the node's command round trips on a Redis Cluster.

A round trip whose calls all go to one node (the usual: one step for one endpoint) is written
straight to that node, on a connection of redis-py's pool for it; the others, and the calls a
node redirected, go as a redis-py cluster pipeline: redis-py groups the calls by the node that
owns each one's slot, sends one pipeline per node, and follows MOVED, ASK and TRYAGAIN for the
calls that got them. Replies come back raw, as from one server (redis-py's reply parsers are
taken off the commands prq sends), error replies in place, and so are the connection failures
of the nodes that could not be reached: the calls to the other nodes are answered, and the
retry policy sends only the failed steps again (prq.transport.budgets.StepBudgets) after
redis-py has read the cluster's layout afresh. Round trips on a cluster may overlap (each
checks out connections of its own), so a step retried on a failing shard does not hold up the
steps for the others. (One server's links: prq.transport.links.)
"""

from __future__ import annotations

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
from prq.transport.wire import _cancels, _exchange, raise_if_cancelled

logger = logging.getLogger(__name__)

__all__ = ["AsyncClusterLink", "SyncClusterLink"]


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
