"""Scenario 5: Redis loses data mid-load without the nodes losing their connection for long:
FLUSHALL; a restart from an older snapshot (time travel); a stale replica promoted. Each is
detected within the data-loss check interval + 1 s of the fault (the first DataLoss a caller
gets, or the first held request cancelled with reason data_loss, whichever comes first); no
caller hangs, no ghost; and after a rollback the receiver must not run a request twice (a
request that ran after the snapshot comes back "queued" in the old data). A second sender
`send`s: each of its sends gets exactly one callback."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import pytest

from prq.embedded import EmbeddedRedis
from tests.fault.checker import CheckResult, check_nodes
from tests.fault.nodes import NodeFactory, NodeProcess
from tests.fault.proxy import FaultProxy
from tests.fault.redis_faults import (
    StaleReplica,
    client_for,
    fail_over,
    flushall,
    rollback_to_snapshot,
    snapshot,
)
from tests.fault.scenarios import CHECK_S, SLACK_S, ends, events, figures
from tests.redis_servers import wait_until

pytestmark = pytest.mark.fault

#: Receiver slots and callers: fewer slots than callers, so requests wait queued (a backlog the
#: rollback cases bring back) while others are held by the handler.
SLOTS, CALLERS = 4, 16
#: Callers of the second sender, which `send`s and waits for the callback (sync facade).
SEND_CALLERS = 4
#: Handler time, ms (long enough that requests are held when the fault strikes).
SERVICE_MS = 150.0
#: Calls ok before the fault (steady load), and between a snapshot/freeze and the fault.
WARM_OK, BETWEEN_OK = 30, 20
#: Calls ok after the fault (the nodes work again without a restart).
AFTER_OK = 20


def _ok_count(sender: NodeProcess, since: float = 0.0) -> int:
    return sum(r["outcome"] == "ok" and r["t_mono"] >= since for r in events(sender, "end"))


def _detection(result: CheckResult, receiver: NodeProcess) -> tuple[float | None, float | None]:
    """(first DataLoss a caller got, first held request cancelled as data_loss), monotonic."""
    cancels = [r["t_mono"] for r in events(receiver, "cancelled") if r.get("reason") == "data_loss"]
    return result.first_end("DataLoss"), min(cancels) if cancels else None


@contextlib.contextmanager
def _maybe_replica(case: str, primary: EmbeddedRedis) -> Iterator[StaleReplica | None]:
    if case != "stale_replica":
        yield None
        return
    with StaleReplica(primary) as stale:
        yield stale


@pytest.mark.parametrize("case", ["flushall", "snapshot", "stale_replica"])
@pytest.mark.timeout(90)
def test_data_loss_is_detected(
    case: str,
    nodes: NodeFactory,
    make_proxy: Callable[..., FaultProxy],
    fault_redis: EmbeddedRedis,
    fault_prefix: str,
) -> None:
    with _maybe_replica(case, fault_redis) as stale:
        # Given a receiver and a sender under steady load, each on its own link to "the primary"
        # (and a second sender whose callers `send` and wait for the callback)
        links = [make_proxy(), make_proxy(), make_proxy()]
        receiver = nodes.receiver(
            "r1", concurrency=SLOTS, handler="sleep", handler_ms=SERVICE_MS, redis_url=links[0].url
        )
        sender = nodes.sender(
            "s1", concurrency=CALLERS, duration_s=60.0, call_deadline_s=20.0, redis_url=links[1].url
        )
        sending = nodes.sender(
            "s2",
            facade="sync",
            call_style="send",
            concurrency=SEND_CALLERS,
            duration_s=60.0,
            call_deadline_s=20.0,
            redis_url=links[2].url,
        )
        wait_until(lambda: _ok_count(sender) >= WARM_OK, 30, 0.05, "steady load")

        # When Redis loses data
        if case == "flushall":
            flushall(fault_redis)
            fault_at = time.monotonic()
            fault_s = 0.0
        elif case == "snapshot":
            # (a snapshot now, more calls run after it, then a crash and a restart from it)
            snapshot(fault_redis)
            taken_at = time.monotonic()
            wait_until(lambda: _ok_count(sender, taken_at) >= BETWEEN_OK, 20, 0.05, "more calls")
            down_at = time.monotonic()
            fault_at = rollback_to_snapshot(fault_redis)
            fault_s = fault_at - down_at
        else:
            # (replication stops silently, more calls run, the primary dies, the stale replica
            # is promoted and the nodes' links follow it)
            assert stale is not None
            stale.freeze()
            frozen_at = time.monotonic()
            wait_until(lambda: _ok_count(sender, frozen_at) >= BETWEEN_OK, 20, 0.05, "more calls")
            down_at = time.monotonic()
            fail_over(links, stale.promote())
            fault_at = time.monotonic()
            fault_s = fault_at - down_at

        # And the load goes on until new calls succeed again (no restart of any node)
        wait_until(lambda: _ok_count(sender, fault_at) >= AFTER_OK, 30, 0.05, "calls ok again")
        assert sender.stop() == 0
        assert sending.stop() == 0
        assert receiver.stop() == 0

        # Then the loss was detected within the check interval + 1 s of the fault
        server = stale.replica if stale is not None else fault_redis
        with client_for(server) as client:
            result = check_nodes(
                nodes.nodes, name=f"S05-{case}", redis_client=client, prefix=fault_prefix
            )
        print(result.report())
        first_error, first_cancel = _detection(result, receiver)
        detections = [t for t in (first_error, first_cancel) if t is not None]
        reruns = [
            r["t_mono"] - fault_at
            for r in events(receiver, "start")
            if r["id"] in result.duplicates and r["t_mono"] > fault_at - fault_s
        ]
        # (fault_at is when the restart/failover call returned; a node may reach the restarted
        # server a few ms before that, so a detection can show as slightly negative)
        figures(
            f"S05-{case}",
            fault_took_s=fault_s,
            first_DataLoss_after_fault_s=None if first_error is None else first_error - fault_at,
            first_data_loss_cancel_after_fault_s=None
            if first_cancel is None
            else first_cancel - fault_at,
            bound_s=CHECK_S + SLACK_S,
            duplicates=len(result.duplicates),
            reruns_after_fault_s=[round(t, 3) for t in sorted(reruns)[:3]],
            ok_after_fault=_ok_count(sender, fault_at),
        )
        assert detections, f"{case}: Redis lost data, yet no node declared data loss"
        assert min(detections) - fault_at <= CHECK_S + SLACK_S
        # And no caller hangs, nothing runs after its caller was told it did not, every key has
        # a TTL; and no request ran twice (after a rollback too)
        result.assert_clean(min_calls=WARM_OK)
        assert ends(sending), "the sending node's sends got no callback"
