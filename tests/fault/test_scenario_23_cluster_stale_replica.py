"""Scenario 23: on a Redis Cluster (3 masters, a replica each), the replica of the master that
owns a busy endpoint stops (SIGSTOP) while calls go on, so it misses their writes; then that
master is killed (-9), the replica resumes and is promoted with its stale data. The nodes
declare data loss for that master's slots only: the calls whose requests it had fail with
DataLoss (or end otherwise typed), none hangs, runs twice, or runs after its caller was told it
did not; calls to an endpoint on another master never see an error; and the promoted replica
serves calls again."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis.cluster

from tests.cluster_servers import ClusterSet
from tests.fault.checker import check_nodes
from tests.fault.nodes import NodeFactory
from tests.fault.redis_faults import crash
from tests.fault.scenarios import (
    data_loss_declared,
    endpoint_elsewhere,
    ends,
    figures,
    hold_fault,
    ok_since,
    owner_port,
)
from tests.fault.timings import FAULT_REDIS_SETTINGS, FAULT_TIMINGS
from tests.redis_servers import new_prefix, wait_until

pytestmark = pytest.mark.fault

#: The endpoint on the master that is killed.
STALE_ENDPOINT = "poll://fault"
#: Retry budget: a failover takes the cluster's node timeout (2 s) and an election.
BUDGET_S = 15.0
#: Calls ok before the fault, and after the promotion.
WARM_OK, AFTER_OK = 100, 100
#: How long the replica misses the master's writes before the master dies.
STALE_S = 1.5
SERVICE_MS = 50.0


@pytest.mark.timeout(150)
def test_a_failover_to_a_replica_that_missed_writes_fails_only_that_shards_calls(
    fault_cluster: ClusterSet, fault_dir: Path
) -> None:
    cluster = fault_cluster
    client = cluster.cluster_client()
    port = owner_port(client, STALE_ENDPOINT)
    other = endpoint_elsewhere(client, port)
    client.close()
    victim = next(m for m in cluster.masters if m.port == port)
    replica = cluster.replicas[cluster.masters.index(victim)]
    # (a replica however long out of touch may still be elected: it is stale, as the test wants)
    with cluster.client(replica) as c:
        c.config_set("cluster-replica-validity-factor", 0)
    prefix = new_prefix()
    nodes = NodeFactory(
        fault_dir,
        redis_url=cluster.url,
        prefix=prefix,
        queue_settings={**FAULT_TIMINGS, "retry_budget_s": BUDGET_S},
        redis_settings=dict(FAULT_REDIS_SETTINGS),
    )
    try:
        # Given a receiver and a sender per facade on the endpoint, and on one on another master
        receivers = [
            nodes.receiver(
                f"r-{facade}-{n}",
                facade=facade,
                endpoint=endpoint,
                concurrency=16,
                handler="sleep",
                handler_ms=SERVICE_MS,
            )
            for n, endpoint in enumerate((STALE_ENDPOINT, other))
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
            for n, endpoint in enumerate((STALE_ENDPOINT, other))
            for facade in ("async", "sync")
        ]
        stale, others = senders[:2], senders[2:]
        wait_until(lambda: ok_since(senders, 0.0) >= 2 * WARM_OK, 60, 0.05, "steady load")

        # When the replica stops while calls go on, then the master dies and the replica,
        # resumed, is promoted without the writes it missed
        stopped_at = time.monotonic()
        replica.pause()
        # (its link cut too: else what its socket buffered while it was stopped would still
        # reach it when it resumes)
        with cluster.client(victim) as c:
            c.client_kill_filter(_type="replica")
        hold_fault(STALE_S)
        crash(victim)
        replica.resume()

        def promoted() -> bool:
            with cluster.client(replica) as c:
                return str(c.info("replication").get("role")) == "master"

        wait_until(promoted, 30, 0.1, "the stale replica promoted")
        promoted_at = time.monotonic()

        # Then every node that used the endpoint declares data loss for that shard's slots
        wait_until(
            lambda: all(data_loss_declared(n) for n in [*stale, *receivers[:2]]),
            20, 0.1, "the loss declared",
        )  # fmt: skip
        # And calls to the promoted replica succeed again
        wait_until(lambda: ok_since(stale, promoted_at) >= AFTER_OK, 60, 0.1, "calls after")
        for node in [*senders, *receivers]:
            assert node.stop() == 0, node.log_tail()
        for node in [*senders, *receivers]:
            assert all("slots=" in line for line in data_loss_declared(node)), node.log_tail()
        # And nothing failed on the other master's endpoint
        assert [r for s in others for r in ends(s) if r["outcome"] != "ok"] == []
        lost = [r for s in stale for r in ends(s) if r["outcome"] == "DataLoss"]
        assert lost, "the stale promotion met no call in flight"

        after = redis.cluster.RedisCluster(host="127.0.0.1", port=replica.port, socket_timeout=10)
        try:
            result = check_nodes(
                nodes.nodes,
                name="S23",
                redis_client=after,  # type: ignore[arg-type]
                prefix=prefix,
                data_loss_windows=[(stopped_at - 1.0, promoted_at + BUDGET_S)],
            )
        finally:
            after.close()
        print(result.report())
        figures(
            "S23",
            failover_s=promoted_at - stopped_at,
            data_loss_failures=len(lost),
            ok_after=ok_since(stale, promoted_at),
            ok_elsewhere=ok_since(others, stopped_at),
        )
        result.assert_clean(min_calls=2 * WARM_OK, max_false_data_loss=0)
    finally:
        replica.resume()  # (a no-op unless the test failed while it was stopped)
        nodes.cleanup()
