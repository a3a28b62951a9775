"""Scenario 21: on a Redis Cluster (3 masters, a replica each), one master loses its data under
load (FLUSHALL; its replica follows). The calls whose requests lived on that shard and were in
flight fail with DataLoss (or succeed, if they ended first); calls to an endpoint on another
master never see an error; no call hangs, runs twice, or runs after its caller was told it did
not; and the flushed shard serves calls again at once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.cluster_servers import ClusterSet
from tests.fault.checker import check_nodes
from tests.fault.nodes import NodeFactory
from tests.fault.scenarios import (
    data_loss_declared,
    endpoint_elsewhere,
    ends,
    figures,
    ok_since,
    owner_port,
    starts,
)
from tests.fault.timings import FAULT_REDIS_SETTINGS, FAULT_TIMINGS
from tests.redis_servers import new_prefix, wait_until

pytestmark = pytest.mark.fault

#: The endpoint on the master that is flushed.
FLUSHED_ENDPOINT = "poll://fault"
#: Calls that must have succeeded before the flush, and after it.
WARM_OK, AFTER_OK = 100, 100
#: Handler time, ms (requests are held when the shard loses them).
SERVICE_MS = 50.0


@pytest.mark.timeout(150)
def test_a_shard_flushed_under_load_fails_only_its_own_calls(
    fault_cluster: ClusterSet, fault_dir: Path
) -> None:
    cluster = fault_cluster
    client = cluster.cluster_client()
    flushed_port = owner_port(client, FLUSHED_ENDPOINT)
    other = endpoint_elsewhere(client, flushed_port)
    flushed_master = next(m for m in cluster.masters if m.port == flushed_port)
    prefix = new_prefix()
    nodes = NodeFactory(
        fault_dir,
        redis_url=cluster.url,
        prefix=prefix,
        queue_settings=dict(FAULT_TIMINGS),
        redis_settings=dict(FAULT_REDIS_SETTINGS),
    )
    try:
        # Given a receiver per facade on each endpoint, and senders calling both under load
        receivers = [
            nodes.receiver(
                f"r-{facade}-{n}",
                facade=facade,
                endpoint=endpoint,
                concurrency=16,
                handler="sleep",
                handler_ms=SERVICE_MS,
            )
            for n, endpoint in enumerate((FLUSHED_ENDPOINT, other))
            for facade in ("async", "sync")
        ]
        senders = [
            nodes.sender(
                f"s-{facade}-{n}",
                facade=facade,
                endpoint=endpoint,
                concurrency=8,
                duration_s=60.0,
                call_deadline_s=20.0,
            )
            for n, endpoint in enumerate((FLUSHED_ENDPOINT, other))
            for facade in ("async", "sync")
        ]
        victims, others = senders[:2], senders[2:]
        wait_until(lambda: ok_since(senders, 0.0) >= 2 * WARM_OK, 60, 0.05, "steady load")

        # When the endpoint's master loses all its data
        flushed_at = time.monotonic()
        with cluster.client(flushed_master) as c:
            c.flushall()

        # Then every node declares the loss, for that master's slots only
        try:
            wait_until(
                lambda: all(data_loss_declared(node) for node in [*senders, *receivers]),
                20, 0.1, "every node declared the loss",
            )  # fmt: skip
        except AssertionError as exc:  # (say which nodes did not, and what they logged)
            silent = [node for node in [*senders, *receivers] if not data_loss_declared(node)]
            tails = "\n".join(f"--- {node.name}:\n{node.log_tail()}" for node in silent)
            raise AssertionError(f"{exc}; silent: {[n.name for n in silent]}\n{tails}") from None
        # (and each victim's calls in flight whose records the flush took have read them gone:
        # a declaration wakes them, and they fail with DataLoss a round trip later)
        all_declared_at = time.monotonic()
        wait_until(
            lambda: all(any(r["outcome"] == "DataLoss" for r in ends(s)) for s in victims),
            20, 0.05, "the flushed shard's calls in flight failed",
        )  # fmt: skip
        declared_by = max(
            next(r["t_mono"] for r in ends(s) if r["outcome"] == "DataLoss") for s in victims
        )
        # And calls to the flushed shard succeed again, while those to the other one never
        # stopped
        wait_until(lambda: ok_since(victims, declared_by) >= AFTER_OK, 60, 0.1, "calls after")
        assert ok_since(others, flushed_at) > 0
        for node in [*senders, *receivers]:
            assert node.stop() == 0, node.log_tail()
        for node in [*senders, *receivers]:
            assert all("slots=" in line for line in data_loss_declared(node)), node.log_tail()
        failed_elsewhere = [r for s in others for r in ends(s) if r["outcome"] != "ok"]
        assert failed_elsewhere == []
        lost = [r for s in victims for r in ends(s) if r["outcome"] == "DataLoss"]
        assert lost, "the flush met no call in flight"
        # Each receiver of the flushed endpoint runs calls again: nothing queued after the
        # flush is refused (its numbers are above every fence, prq.node.data_loss)
        fresh = {r["id"] for s in victims for r in starts(s) if r["t_mono"] >= all_declared_at}
        ran_again = [
            min((r["t_mono"] for r in starts(rcv) if r["id"] in fresh), default=None)
            for rcv in receivers[:2]
        ]
        idle = [rcv.name for rcv, t in zip(receivers[:2], ran_again, strict=True) if t is None]
        assert not idle, f"receivers of the flushed shard that ran no call again: {idle}"
        window_end = max(declared_by, all_declared_at)

        result = check_nodes(
            nodes.nodes,
            name="S21",
            redis_client=client,  # type: ignore[arg-type]
            prefix=prefix,
            data_loss_windows=[(flushed_at - 0.1, window_end + 0.1)],
        )
        print(result.report())
        figures(
            "S21",
            data_loss_failures=len(lost),
            declared_after_s=declared_by - flushed_at,
            ok_after=ok_since(victims, declared_by),
            ok_elsewhere_after=ok_since(others, flushed_at),
        )
        result.assert_clean(min_calls=2 * WARM_OK, max_false_data_loss=0)
    finally:
        client.close()
        nodes.cleanup()
