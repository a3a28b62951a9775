"""Scenario 22: on a Redis Cluster (3 masters, a replica each), the pub/sub connections to the
master that owns a busy endpoint are cut again and again, and for a while its pulses are
dropped on their way, by a fault proxy that master announces as its address (so every node
reaches it through the proxy). Pulses are only hints: every call ends ok (the waits poll), none
runs twice; each node subscribes again on that master after each cut; and the endpoint on
another master goes on untouched."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis.cluster

from tests.cluster_servers import ClusterSet
from tests.fault.checker import check_nodes
from tests.fault.nodes import NodeFactory, NodeProcess
from tests.fault.proxy import FaultProxy
from tests.fault.scenarios import (
    endpoint_elsewhere,
    ends,
    figures,
    hold_fault,
    ok_since,
    owner_port,
    shard_channels,
)
from tests.fault.timings import FAULT_REDIS_SETTINGS, FAULT_TIMINGS
from tests.redis_servers import new_prefix, wait_until

pytestmark = pytest.mark.fault

#: The endpoint on the master behind the proxy.
CUT_ENDPOINT = "poll://fault"
#: Cuts of the pub/sub connections, and calls ok between two.
CUTS, OK_BETWEEN = 5, 40
#: How long pulses are dropped on their way.
DROP_S = 3.0
SERVICE_MS = 10.0
#: Shard channels of the endpoint: its pulse channel, and a node channel per node.
CHANNELS = 1 + 4


def _ok_after(senders: list[NodeProcess], since: float) -> Callable[[], bool]:
    return lambda: ok_since(senders, since) >= OK_BETWEEN


def _announced_everywhere(cluster: ClusterSet, port: int) -> bool:
    """Every master's CLUSTER SLOTS names a master at `port`."""
    for master in cluster.masters:
        with cluster.client(master) as c:
            ranges = c.execute_command("CLUSTER", "SLOTS")
        if not any(int(primary[1]) == port for _, _, primary, *_ in ranges):
            return False
    return True


@pytest.mark.timeout(150)
def test_pubsub_links_to_one_shard_cut_under_load_cost_no_call(
    fault_cluster: ClusterSet, fault_dir: Path
) -> None:
    cluster = fault_cluster
    client = cluster.cluster_client()
    port = owner_port(client, CUT_ENDPOINT)
    other = endpoint_elsewhere(client, port)
    client.close()
    master = next(m for m in cluster.masters if m.port == port)
    proxy = FaultProxy(port)
    prefix = new_prefix()
    nodes = NodeFactory(
        fault_dir,
        redis_url=cluster.url,
        prefix=prefix,
        queue_settings=dict(FAULT_TIMINGS),
        redis_settings=dict(FAULT_REDIS_SETTINGS),
    )
    try:
        # Given the endpoint's master reached through a proxy (it announces the proxy's port)
        with cluster.client(master) as c:
            c.config_set("cluster-announce-port", proxy.port)
        wait_until(lambda: _announced_everywhere(cluster, proxy.port), 20, 0.1, "announced")
        # And a receiver and a sender per facade on it, and on an endpoint on another master
        receivers = [
            nodes.receiver(
                f"r-{facade}-{n}",
                facade=facade,
                endpoint=endpoint,
                concurrency=16,
                handler="sleep",
                handler_ms=SERVICE_MS,
            )
            for n, endpoint in enumerate((CUT_ENDPOINT, other))
            for facade in ("async", "sync")
        ]
        senders = [
            nodes.sender(
                f"s-{facade}-{n}",
                facade=facade,
                endpoint=endpoint,
                concurrency=8,
                duration_s=120.0,
                call_deadline_s=20.0,
            )
            for n, endpoint in enumerate((CUT_ENDPOINT, other))
            for facade in ("async", "sync")
        ]
        cut, others = senders[:2], senders[2:]
        wait_until(lambda: ok_since(senders, 0.0) >= 2 * OK_BETWEEN, 60, 0.05, "steady load")
        first_fault = time.monotonic()

        # When the pub/sub connections through the proxy are cut, again and again, calls going
        # on between two cuts
        resets = 0
        with cluster.client(master) as on_master:
            for _ in range(CUTS):
                resets += proxy.reset_connections(pubsub_only=True)
                wait_until(_ok_after(cut, time.monotonic()), 60, 0.05, "calls after a cut")
                # Then every node subscribes again on that master
                wait_until(
                    lambda: len(shard_channels(on_master, prefix)) == CHANNELS,
                    15, 0.1, "subscribed again",
                )  # fmt: skip
            # When its pulses are dropped on their way for a while
            proxy.drop_pubsub_messages(True)
            at = time.monotonic()
            hold_fault(DROP_S)
            proxy.drop_pubsub_messages(False)
            # Then calls went on meanwhile (by polling)
            assert ok_since(cut, at) > 0
        for node in [*senders, *receivers]:
            assert node.stop() == 0, node.log_tail()

        after = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.masters[0].port)
        try:
            result = check_nodes(nodes.nodes, name="S22", redis_client=after, prefix=prefix)  # type: ignore[arg-type]
        finally:
            after.close()
        print(result.report())
        figures(
            "S22",
            resets=resets,
            dropped_pulses=proxy.dropped_frames,
            ok_on_the_cut_shard=ok_since(cut, first_fault),
            ok_elsewhere=ok_since(others, first_fault),
        )
        # And no call failed, hung, ran twice or came from nowhere, on either endpoint
        assert [r for s in senders for r in ends(s) if r["outcome"] != "ok"] == []
        result.assert_clean(min_calls=2 * OK_BETWEEN, max_false_data_loss=0, min_success_rate=1.0)
        assert resets >= CUTS and proxy.dropped_frames > 0
    finally:
        nodes.cleanup()
        proxy.close()
