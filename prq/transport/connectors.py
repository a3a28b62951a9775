"""Connectors: where a node's pub/sub readers (prq.transport.pulses, prq.transport.shard_pulses)
get their connections, and which cluster master serves which slots.

A connector makes a fresh, unconnected connection each time it is called: at a reader's start
and after each loss. One server has one reader; a cluster has one per master, each connected
to its node with the cluster client's credentials and TLS, and routed by `shard_layout`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import redis

from prq.transport.cluster_layout import async_layout, sync_layout

__all__ = [
    "async_node_connector",
    "async_pubsub_connector",
    "shard_layout",
    "sync_node_connector",
    "sync_pubsub_connector",
]


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
    client's credentials and TLS; a ConnectionError once the client no longer knows it. A
    node that failed is not connected to before the layout was read again
    (prq.transport.cluster_layout): once a replica is promoted, its dead master is not tried."""

    async def to_node() -> Any:
        await async_layout(client).settle([name])
        node = client.get_node(node_name=name)
        if node is None:
            raise redis.exceptions.ConnectionError(f"cluster node {name} is gone from the layout")
        return node.connection_class(**node.connection_kwargs)

    return to_node


def sync_node_connector(client: Any, name: str) -> Callable[[], Any]:
    """The blocking twin of async_node_connector."""

    def to_node() -> Any:
        sync_layout(client).settle([name])
        node = client.get_node(node_name=name)
        if node is None:
            raise redis.exceptions.ConnectionError(f"cluster node {name} is gone from the layout")
        if node.redis_connection is None:
            sync_layout(client).refresh()
            node = client.get_node(node_name=name)
        if node is None or node.redis_connection is None:
            raise redis.exceptions.ConnectionError(f"cluster node {name} is gone from the layout")
        return node.redis_connection.connection_pool.make_connection()

    return to_node
