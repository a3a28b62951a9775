"""Scenario 20: on a Redis Cluster, the slot of a busy endpoint is migrated from one master to
another and back, several times, while calls run (CLUSTER SETSLOT IMPORTING / MIGRATING,
MIGRATE of its keys, SETSLOT NODE): the nodes meet ASK, TRYAGAIN and MOVED replies; then a
fourth master joins the cluster and the slot moves onto it. Every call ends (succeeds, or fails
with a typed error); none runs twice, none runs after its caller was told it did not, none is
lost: the load goes on after each move, and every node's subscriptions follow the slot."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from prq.core.keys import KeySchema
from prq.embedded import EmbeddedRedis
from tests.cluster_servers import ClusterSet
from tests.fault.checker import check_nodes
from tests.fault.nodes import NodeFactory, NodeProcess
from tests.fault.scenarios import figures, hold_fault, ok_since, shard_channels
from tests.fault.timings import FAULT_REDIS_SETTINGS, FAULT_TIMINGS
from tests.redis_servers import new_prefix, wait_until

pytestmark = pytest.mark.fault

ENDPOINT = "poll://migrating"
#: Moves of the slot (there and back again, in turn), and calls ok between two moves.
MOVES, OK_BETWEEN = 4, 40
#: Keys moved per MIGRATE, and the pause between two (a move lasts a second or so).
MIGRATE_BATCH, BATCH_PAUSE_S = 10, 0.02
BUDGET_S = 15.0
SERVICE_MS = 10.0
#: Shard channels of the endpoint: its pulse channel, and a node channel per node.
CHANNELS = 1 + 4


def _node_id(cluster: ClusterSet, node: EmbeddedRedis) -> str:
    with cluster.client(node) as c:
        return str(c.execute_command("CLUSTER", "MYID"))


def migrate_slot(
    cluster: ClusterSet, slot: int, source: EmbeddedRedis, target: EmbeddedRedis
) -> int:
    """Move `slot` from `source` to `target` as redis-cli --cluster reshard does; returns the
    keys moved."""
    source_id, target_id = _node_id(cluster, source), _node_id(cluster, target)
    moved = 0
    with cluster.client(source) as src, cluster.client(target) as dst:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        for _ in range(10_000):  # bounded: each round moves what is there now
            keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, MIGRATE_BATCH)
            if not keys:
                break
            src.execute_command(
                "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "REPLACE", "KEYS", *keys
            )
            moved += len(keys)
            hold_fault(BATCH_PAUSE_S)  # the slot stays half moved a while: calls meet it so
        for master in cluster.masters:
            with cluster.client(master) as c:
                c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    return moved


def _ok_after(senders: list[NodeProcess], since: float) -> Callable[[], bool]:
    return lambda: ok_since(senders, since) >= OK_BETWEEN


def redirections(cluster: ClusterSet) -> dict[str, int]:
    """ASK, TRYAGAIN and MOVED replies the masters gave (INFO errorstats), summed."""
    seen = {"ASK": 0, "TRYAGAIN": 0, "MOVED": 0}
    for master in cluster.masters:
        with cluster.client(master) as c:
            stats = c.info("errorstats")
        for kind in seen:
            seen[kind] += int(stats.get(f"errorstat_{kind}", {}).get("count", 0))
    return seen


@pytest.mark.timeout(150)
def test_a_slot_migrated_back_and_forth_under_load_loses_and_repeats_no_call(
    fault_cluster: ClusterSet, fault_dir: Path
) -> None:
    cluster = fault_cluster
    client = cluster.cluster_client()
    tag_key = KeySchema("prq").endpoint(ENDPOINT).sequence
    slot = int(client.keyslot(tag_key))  # type: ignore[no-untyped-call]
    home = next(m for m in cluster.masters if m.port == client.get_node_from_key(tag_key).port)  # type: ignore[no-untyped-call]
    away = next(m for m in cluster.masters if m is not home)
    client.close()
    prefix = new_prefix()
    nodes = NodeFactory(
        fault_dir,
        redis_url=cluster.url,
        prefix=prefix,
        endpoint=ENDPOINT,
        queue_settings={**FAULT_TIMINGS, "retry_budget_s": BUDGET_S},
        redis_settings=dict(FAULT_REDIS_SETTINGS),
    )
    try:
        # Given a receiver per facade and a sender per facade calling the endpoint under load
        receivers = [
            nodes.receiver(
                f"r-{facade}", facade=facade, concurrency=16, handler="sleep", handler_ms=SERVICE_MS
            )
            for facade in ("async", "sync")
        ]
        senders = [
            nodes.sender(
                f"s-{facade}",
                facade=facade,
                concurrency=8,
                duration_s=120.0,
                call_deadline_s=BUDGET_S + 10,
            )
            for facade in ("async", "sync")
        ]
        wait_until(lambda: ok_since(senders, 0.0) >= OK_BETWEEN, 60, 0.05, "steady load")

        # When its slot moves to another master and back, MOVES times, calls going on between
        moves = []
        for n in range(MOVES):
            source, target = (home, away) if n % 2 == 0 else (away, home)
            started = time.monotonic()
            keys = migrate_slot(cluster, slot, source, target)
            moves.append((keys, time.monotonic() - started))
            done_at = time.monotonic()
            wait_until(_ok_after(senders, done_at), 60, 0.05, "calls after the move")
            # and every node's subscriptions moved with the slot (sharded pub/sub)
            with cluster.client(target) as on_target, cluster.client(source) as on_source:
                wait_until(
                    lambda: len(shard_channels(on_target, prefix)) == CHANNELS
                    and not shard_channels(on_source, prefix),
                    15, 0.1, "the subscriptions on the slot's new master",
                )  # fmt: skip
        # When a fourth master joins, and the slot moves onto it (it ended back home)
        added = cluster.add_master()
        started = time.monotonic()
        keys = migrate_slot(cluster, slot, home, added)
        moves.append((keys, time.monotonic() - started))
        wait_until(_ok_after(senders, time.monotonic()), 60, 0.05, "calls on the new master")
        with cluster.client(added) as on_added, cluster.client(home) as on_home:
            wait_until(
                lambda: len(shard_channels(on_added, prefix)) == CHANNELS
                and not shard_channels(on_home, prefix),
                15, 0.1, "the subscriptions on the new master",
            )  # fmt: skip
        for node in [*senders, *receivers]:
            assert node.stop() == 0, node.log_tail()

        # Then: no call hung, ran twice, ran after being told it did not, or came from nowhere
        after = redis.cluster.RedisCluster(host="127.0.0.1", port=home.port, socket_timeout=10)
        try:
            result = check_nodes(
                nodes.nodes,
                name="S20",
                redis_client=after,  # type: ignore[arg-type]
                prefix=prefix,
            )
        finally:
            after.close()
        print(result.report())
        seen = redirections(cluster)
        figures("S20", slot=slot, moves=moves, **seen)
        result.assert_clean(
            min_calls=(MOVES + 1) * OK_BETWEEN, max_false_data_loss=0, min_success_rate=0.99
        )
        # And the calls did meet the slot half moved (else this tested nothing)
        assert seen["ASK"] + seen["TRYAGAIN"] > 0, seen
    finally:
        nodes.cleanup()
