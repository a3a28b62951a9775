"""The blocking node's cluster link: its command round trips on a Redis Cluster, as redis-py
cluster pipelines with the node of each call named (see prq.transport.cluster_links, whose
asyncio link this one is the twin of, and whose reply handling it shares).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.cluster
from redis.exceptions import ResponseError

from prq.protocol.effects import Call, Reply
from prq.protocol.scripts.loading import for_cluster
from prq.transport.cluster_layout import sync_layout
from prq.transport.cluster_links import (
    _CLIENT_SLIPS,
    _CLUSTER_TRANSIENT,
    _groups,
    _joined,
    _mended,
    _per_server,
    _slip,
    raw_replies,
)

__all__ = ["SyncClusterLink"]


class SyncClusterLink:
    """The blocking twin of AsyncClusterLink: every round trip is a redis-py cluster pipeline
    (one per node, written to all before any is read), with the node of each call named."""

    def __init__(self, client: redis.cluster.RedisCluster) -> None:
        # redis-py's blocking cluster client is only partly typed; this stays internal.
        self._client: Any = client
        self._layout = sync_layout(client)

    def round_trip(self, calls: Sequence[Call]) -> list[Reply]:
        for node in self._client.get_nodes():
            if node.redis_connection is not None:
                raw_replies(node.redis_connection.response_callbacks)
        calls = [for_cluster(call) for call in calls]
        special = _per_server(calls)
        keyed = [call for i, call in enumerate(calls) if i not in special]
        replies: list[Reply] = []
        if keyed:
            nodes = [self._node_for(call) for call in keyed]
            if self._layout.any_suspect(node.name for node in nodes):
                self._layout.shun()  # (redis-py reads the layout itself if it cannot connect)
                self._layout.refresh()  # not to a node that failed, if another serves now
                nodes = [self._node_for(call) for call in keyed]
                for node in nodes:
                    if self._layout.suspect(node.name):  # (its pool made now, to be known)
                        self._client.get_redis_connection(node)
                        self._layout.saw(node)
            replies = self._keyed(keyed, nodes)
        for i in special:
            primaries = self._client.get_primaries()
            replies.insert(i, _joined([self._on(node, calls[i]) for node in primaries]))
        return replies

    def _keyed(self, calls: Sequence[Call], nodes: Sequence[Any]) -> list[Reply]:
        """One pipeline; a node that failed has its calls' failures in place. A suspect node
        (prq.transport.cluster_layout) is connected to first, here: should it not answer, its
        calls fail in place without redis-py reading the layout by itself, under the lock
        every reading of it takes. Should a node not even be connected to (the pipeline
        raises before it wrote anything), each node's calls go again on their own, so that
        only that node's fail."""
        unreached = self._reach_suspects(nodes)
        if unreached:
            at = [i for i, node in enumerate(nodes) if node.name not in unreached]
            if not at:
                raise next(iter(unreached.values()))
            replies: list[Reply] = [unreached.get(node.name) for node in nodes]
            part = self._keyed([calls[i] for i in at], [nodes[i] for i in at])
            for n, i in enumerate(at):
                replies[i] = part[n]
            return replies
        groups = _groups(nodes)
        try:
            replies = self._pipeline(calls, nodes)
        except _CLUSTER_TRANSIENT:
            if len(groups) == 1:
                self._layout.failed(nodes[0].name)
                raise
            replies = [None] * len(calls)
            failures = 0
            for name, at in groups.items():
                try:
                    part = self._pipeline([calls[i] for i in at], [nodes[i] for i in at])
                except _CLUSTER_TRANSIENT as exc:
                    failures += 1
                    self._layout.failed(name)
                    if failures == len(groups):
                        raise
                    part = [exc] * len(at)
                for n, i in enumerate(at):
                    replies[i] = part[n]
            return replies
        failed = {nodes[i].name for i, r in enumerate(replies) if isinstance(r, _CLUSTER_TRANSIENT)}
        for name in groups:
            if name in failed:
                self._layout.failed(name)
            else:
                self._layout.answered(str(name))
        return replies

    def _reach_suspects(self, nodes: Sequence[Any]) -> dict[str, Exception]:
        """Connect to each suspect node of `nodes` (a connection of its pool, left there for
        the pipeline); the ones that could not be reached, with their failure."""
        unreached: dict[str, Exception] = {}
        for node in {node.name: node for node in nodes}.values():
            if not self._layout.suspect(node.name):
                continue
            pool = self._client.get_redis_connection(node).connection_pool
            try:
                pool.release(pool.get_connection())
            except _CLUSTER_TRANSIENT as exc:
                unreached[node.name] = exc
                self._layout.failed(node.name)
        return unreached

    def _pipeline(self, calls: Sequence[Call], nodes: Sequence[Any]) -> list[Reply]:
        pipe = self._client.pipeline(transaction=False)
        for call, node in zip(calls, nodes, strict=True):
            pipe.execute_command(*call.args, target_nodes=node)
        try:
            return _mended(pipe.execute(raise_on_error=False))
        except _CLIENT_SLIPS as exc:
            self._layout.failed(None)
            raise _slip(exc) from exc

    def _on(self, node: Any, call: Call) -> Reply:
        try:
            reply = self._client.execute_command(*call.args, target_nodes=node)
        except (ResponseError, *_CLUSTER_TRANSIENT) as exc:
            if isinstance(exc, _CLUSTER_TRANSIENT):
                self._layout.failed(node.name)
            return exc
        except _CLIENT_SLIPS as exc:
            self._layout.failed(node.name)
            return _slip(exc)
        self._layout.answered(node.name)
        return reply  # type: ignore[no-any-return]

    def _node_for(self, call: Call) -> Any:
        """The primary that owns the call's slot, from redis-py's slot table. Named here
        because redis-py's blocking pipeline would otherwise ask the server (COMMAND GETKEYS,
        one more round trip) where the keys of each EVALSHA are; its own slot function reads
        them from the arguments. Redirections are still redis-py's to follow."""
        slot = self._client.determine_slot(*call.args)
        return self._client.nodes_manager.get_node_from_slot(slot)

    def close(self) -> None:
        """Stop reading the layout (the connections are the cluster client's)."""
        self._layout.close()
