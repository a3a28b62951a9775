"""Scenario 19: on a Redis Cluster (3 masters, a replica each), the master that owns the
endpoint's slot is killed (-9) under load, and the cluster promotes its replica. Every call
ends within its deadline (succeeds, or fails with a typed error); none runs twice, none runs
after its caller was told it did not; the load goes on against the promoted replica. Calls to
an endpoint on another master go on throughout. A replica that missed the last writes before
the kill is a stale replica: data loss for the calls in flight then, and only then."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis.cluster

from tests.cluster_servers import ClusterSet
from tests.fault.checker import check_nodes
from tests.fault.nodes import NodeFactory
from tests.fault.redis_faults import crash
from tests.fault.scenarios import endpoint_elsewhere, figures, ok_since, owner_port, shard_channels
from tests.fault.timings import FAULT_REDIS_SETTINGS, FAULT_TIMINGS
from tests.redis_servers import new_prefix, wait_until

pytestmark = pytest.mark.fault

#: The endpoint on the master that is killed, and one on another master.
KILLED_ENDPOINT = "poll://fault"
#: Retry budget: a failover takes the cluster's node timeout (2 s) and an election.
BUDGET_S = 15.0
#: Calls that must have succeeded before the kill, and after the promotion.
WARM_OK, AFTER_OK = 100, 100
#: Handler time, ms (requests are held when the master dies).
SERVICE_MS = 20.0


@pytest.mark.timeout(150)
def test_a_master_killed_under_load_fails_over_with_no_hung_or_duplicate_call(
    fault_cluster: ClusterSet, fault_dir: Path
) -> None:
    cluster = fault_cluster
    client = cluster.cluster_client()
    victim_port = owner_port(client, KILLED_ENDPOINT)
    other = endpoint_elsewhere(client, victim_port)
    victim = next(m for m in cluster.masters if m.port == victim_port)
    replica = cluster.replicas[cluster.masters.index(victim)]
    prefix = new_prefix()
    settings = {**FAULT_TIMINGS, "retry_budget_s": BUDGET_S}
    nodes = NodeFactory(
        fault_dir,
        redis_url=cluster.url,
        prefix=prefix,
        queue_settings=settings,
        redis_settings=dict(FAULT_REDIS_SETTINGS),
    )
    try:
        # Given a receiver per facade on each endpoint and senders calling both under load
        receivers = [
            nodes.receiver(
                f"r-{facade}-{n}",
                facade=facade,
                endpoint=endpoint,
                concurrency=16,
                handler="sleep",
                handler_ms=SERVICE_MS,
            )
            for n, endpoint in enumerate((KILLED_ENDPOINT, other))
            for facade in ("async", "sync")
        ]
        senders = [
            nodes.sender(
                f"s-{facade}-{n}",
                facade=facade,
                endpoint=endpoint,
                concurrency=8,
                duration_s=90.0,
                call_deadline_s=BUDGET_S + 10,
            )
            for n, endpoint in enumerate((KILLED_ENDPOINT, other))
            for facade in ("async", "sync")
        ]
        victims, others = senders[:2], senders[2:]
        wait_until(lambda: ok_since(victims, 0.0) >= WARM_OK, 60, 0.05, "steady load")

        # When the endpoint's master is killed with SIGKILL
        killed_at = crash(victim)

        # Then its replica is promoted, and calls to the endpoint succeed again
        def promoted() -> bool:
            with cluster.client(replica) as c:
                return str(c.info("replication").get("role")) == "master"

        try:
            wait_until(promoted, 30, 0.1, "the replica promoted")
        except AssertionError:
            print(cluster.report())
            raise
        promoted_at = time.monotonic()
        wait_until(lambda: ok_since(victims, promoted_at) >= AFTER_OK, 60, 0.1, "calls after")
        # And calls to the other master went on while it failed over
        assert ok_since(others, killed_at) > 0
        # And every node listening on the endpoint subscribed again on the promoted replica
        # (sharded pub/sub: its pulse channel, and a node channel per node)
        with cluster.client(replica) as promoted_node:
            wait_until(
                lambda: len(shard_channels(promoted_node, prefix)) == 1 + 4,
                15, 0.1, "the subscriptions on the promoted replica",
            )  # fmt: skip
        for node in [*senders, *receivers]:
            assert node.stop() == 0, node.log_tail()

        after = redis.cluster.RedisCluster(host="127.0.0.1", port=replica.port, socket_timeout=10)
        try:
            result = check_nodes(
                nodes.nodes,
                name="S19",
                redis_client=after,  # type: ignore[arg-type]
                prefix=prefix,
                data_loss_windows=[(killed_at - 1.0, promoted_at + BUDGET_S)],
            )
        finally:
            after.close()
        print(result.report())
        figures(
            "S19",
            failover_s=promoted_at - killed_at,
            ok_after_promotion=ok_since(victims, promoted_at),
            ok_elsewhere_during=ok_since(others, killed_at),
        )
        result.assert_clean(min_calls=WARM_OK, max_false_data_loss=0)
    finally:
        client.close()
        nodes.cleanup()
