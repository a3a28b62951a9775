"""A cluster shard that fails, alone: on a Redis Cluster (3 masters, a replica each) a master is
killed.

- The round trips in flight to the other masters are not disturbed: a BLPOP waiting on a
  healthy master when the killed master's round trip fails stays blocked on the same
  connection (the same client id on that master), and returns the value pushed after, on
  both links (asyncio and blocking). Before, the asyncio link closed every node's connections
  on any node's failure: the BLPOP failed, as would any step in flight to a healthy shard, and
  was retried. (The blocking link did not cut them before either; its case guards that.)
- Once the killed master's replica is promoted, a node that held a request there reads the
  layout again by itself, then closes within its (short) retry budget, giving the request
  back, without connecting to the dead address. The dead address here does not answer (a
  listener that accepts and says nothing, as a host that froze or is cut off): before, the
  node kept the layout it read during the failover, and its close went to the dead master
  and waited on it (12 s, the socket timeout, on the asyncio node; 8.7 s on the blocking one).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from prq.core.config import RedisSettings
from prq.core.keys import KeySchema
from prq.embedded import EmbeddedRedis
from prq.protocol.effects import Call
from prq.transport.client_options import client_kwargs
from prq.transport.cluster_layout import async_layout, sync_layout
from prq.transport.cluster_links import AsyncClusterLink
from prq.transport.sync_cluster_links import SyncClusterLink
from prq.transport.topology import async_client, sync_client
from tests.cluster_servers import ClusterSet
from tests.fault.proxy import LOOPBACK
from tests.fault.redis_faults import crash
from tests.fault.scenarios import owner_port
from tests.fault.timings import FaultQueueFactory, fault_redis_settings
from tests.queue_facades import AnyQueue, SyncQueueAdapter
from tests.redis_servers import async_wait_until, new_prefix

pytestmark = pytest.mark.fault

#: The BLPOP's own timeout, seconds: far longer than the test waits for it.
BLOCK_S = 20
#: The retry budget of the node closed after the failover, seconds.
BUDGET_S = 2.0
#: The socket timeout of that node: longer than a failover, so that a connection hung on the
#: dead address would still hang when the node closes.
HANGING_SOCKET_S = 12.0
#: How long a node may take to read the layout again once every node names the promoted
#: replica (the layout is read every 0.5 s while a node that failed is still named).
RELAYOUT_S = 5.0


def _key_on(client: redis.cluster.RedisCluster, master: EmbeddedRedis, stem: str) -> str:
    """A key of `master`'s slots."""
    for i in range(10_000):
        key = f"{stem}:{{{i}}}"
        if client.get_node_from_key(key).port == master.port:  # type: ignore[no-untyped-call]
            return key
    raise AssertionError(f"no key on {master.port}")


def _blocked_in_blpop(server: redis.Redis) -> list[int]:
    """The ids of the clients blocked in a BLPOP on `server`."""
    return [
        int(c["id"])
        for c in server.client_list()
        if c.get("cmd") == "blpop" and "b" in str(c.get("flags"))
    ]


@contextlib.contextmanager
def _prq_link(facade: str, url: str) -> Iterator[Any]:
    settings = RedisSettings(url=url, socket_timeout_s=BLOCK_S + 10)
    if facade == "async":
        yield AsyncClusterLink(async_client(url, client_kwargs(settings)))
    else:
        client = sync_client(url, client_kwargs(settings))
        link = SyncClusterLink(client)
        try:
            yield link
        finally:
            link.close()
            client.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("facade", ["async", "sync"])
async def test_a_shard_that_fails_leaves_the_round_trips_in_flight_to_the_others_alone(
    fault_cluster: ClusterSet, facade: str
) -> None:
    cluster = fault_cluster
    victim, healthy = cluster.masters[0], cluster.masters[1]
    plain = cluster.cluster_client()
    gone_key, waiting_list = _key_on(plain, victim, "gone"), _key_on(plain, healthy, "list")
    with cluster.client(healthy) as on_healthy, _prq_link(facade, cluster.url) as link:
        executor = ThreadPoolExecutor(2)

        async def round_trip(*args: str | int) -> list[Any]:
            if facade == "async":
                return await link.round_trip([Call(args)])  # type: ignore[no-any-return]
            return await asyncio.wrap_future(executor.submit(link.round_trip, [Call(args)]))

        try:
            if facade == "async":
                await link._client.initialize()  # (as a queue's start does: the layout read)
            # Given a round trip to each master done (their connections open), and a BLPOP
            # blocked on the healthy master
            assert await round_trip("SET", gone_key, "x") == [b"OK"]
            assert await round_trip("DEL", waiting_list) == [0]
            blpop = asyncio.ensure_future(round_trip("BLPOP", waiting_list, BLOCK_S))
            await async_wait_until(
                lambda: _blocked_in_blpop(on_healthy), 10, 0.02, "the BLPOP blocked"
            )
            (blocked,) = _blocked_in_blpop(on_healthy)

            # When the other master is killed, and a round trip to it fails
            crash(victim)
            with contextlib.suppress(redis.ConnectionError):
                failed = await round_trip("GET", gone_key)
                assert isinstance(failed[0], redis.ConnectionError), failed

            # Then the BLPOP still waits on the healthy master, on its connection, and gets
            # the value pushed now: it was neither cut nor sent again
            assert not blpop.done(), blpop.exception() if blpop.done() else None
            assert _blocked_in_blpop(on_healthy) == [blocked]
            on_healthy.rpush(waiting_list, "v")
            assert await asyncio.wait_for(blpop, 10) == [[waiting_list.encode(), b"v"]]
        finally:
            if facade == "async":
                await link.close()
                await link._client.aclose()
            executor.shutdown(wait=False, cancel_futures=True)
            plain.close()


class _SilentAddress:
    """A listener on a dead server's address that accepts and never answers (a host that is
    gone, not one that refuses); it counts the connections made to it."""

    def __init__(self, port: int) -> None:
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((LOOPBACK, port))
        self._sock.listen(128)
        self._accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def connections(self) -> int:
        return len(self._accepted)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed
                return
            self._accepted.append(conn)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # (wakes the accept)
        self._sock.close()
        self._thread.join(5)
        for conn in self._accepted:
            conn.close()


def _raw(queue: AnyQueue) -> Any:
    return queue.raw if isinstance(queue, SyncQueueAdapter) else queue


def _layout_state(queue: AnyQueue) -> str:
    """What the node's cluster layout holds, for a failure's message."""
    client = _raw(queue)._io.client
    sync = isinstance(queue, SyncQueueAdapter)
    layout: Any = sync_layout(client) if sync else async_layout(client)
    poller = getattr(layout, "_poller", None)
    alive = poller is not None and (
        poller.is_alive() if isinstance(poller, threading.Thread) else not poller.done()
    )
    return (
        f"suspects={sorted(layout._suspects)} dropped={sorted(layout._dropped)} "
        f"poller alive={alive} read {time.monotonic() - layout._read_at:.1f} s ago "
        f"startup={sorted(client.nodes_manager.startup_nodes)}"
    )


def _owner_in_layout(queue: AnyQueue, slot: int) -> str:
    """The master the node's cluster client has for `slot`."""
    return str(_raw(queue)._io.client.nodes_manager.slots_cache[slot][0].name)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("facade", ["async", "sync"])
async def test_after_a_failover_a_node_closes_in_its_budget_and_never_tries_the_dead_address(
    fault_cluster: ClusterSet, facade: str
) -> None:
    cluster = fault_cluster
    plain = cluster.cluster_client()
    victim = cluster.masters[0]
    replica = cluster.replicas[0]
    endpoint = next(
        f"poll://failover-{i}"
        for i in range(1000)
        if owner_port(plain, f"poll://failover-{i}") == victim.port
    )
    dead = f"{LOOPBACK}:{victim.port}"
    sequence = KeySchema("prq").endpoint(endpoint).sequence  # (its hash tag names the slot)
    dead_slot: int = plain.keyslot(sequence)  # type: ignore[no-untyped-call]
    queues = FaultQueueFactory(facade, cluster.url, new_prefix())
    silent: _SilentAddress | None = None
    try:
        settings = fault_redis_settings(cluster.url, socket_timeout_s=HANGING_SOCKET_S)
        sender = queues(redis_settings=settings, retry_budget_s=BUDGET_S)
        receiver = queues(redis_settings=settings, retry_budget_s=BUDGET_S)
        # Given a receiver that holds a request of an endpoint on the master that is killed
        await sender.notify(endpoint, "m", {}, delivery="at_least_once")
        held = await receiver.dequeue(endpoint, timeout_s=10)
        assert held is not None
        assert _owner_in_layout(receiver, dead_slot) == dead
        await sender.aclose()  # (only the receiver may connect to the dead address from now)

        # When that master is killed (its address then accepting and saying nothing), and its
        # replica promoted, every node of the cluster naming it
        crash(victim)
        silent = _SilentAddress(victim.port)

        def promoted() -> bool:
            for node in [*cluster.masters[1:], *cluster.replicas]:
                with cluster.client(node) as c:
                    ranges = c.execute_command("CLUSTER", "SLOTS")
                    owner = next(r[2] for r in ranges if r[0] <= dead_slot <= r[1])
                    if int(owner[1]) != replica.port:
                        return False
            return True

        await async_wait_until(promoted, 30, 0.1, "the replica promoted, every node naming it")

        # Then the node reads the layout again by itself (the dead master left it)
        try:
            await async_wait_until(
                lambda: _owner_in_layout(receiver, dead_slot) != dead, RELAYOUT_S, 0.05,
                "the receiver's layout without the dead master",
            )  # fmt: skip
        except AssertionError as exc:  # (what the layout was doing, to tell why)
            raise AssertionError(f"{exc}; {_layout_state(receiver)}") from None
        # And it closes within its budget, giving the request back, and never connects to
        # the dead address
        before = silent.connections
        started = time.monotonic()
        await receiver.aclose()
        took = time.monotonic() - started
        assert took < BUDGET_S, f"closing took {took:.2f} s"
        assert silent.connections == before, "the close connected to the dead address"
    finally:
        await queues.aclose()
        if silent is not None:
            silent.close()
        plain.close()
