"""Scenario 24: three data losses in a row under load from both facades: a flush, a restart
from an older snapshot (a rollback, which brings back requests that ran), and a restart empty,
at 1/6, 1 and 2 data-loss check intervals apart (10 s, 60 s and 120 s at the production
interval of 60 s), on a young endpoint (its first calls a moment before) and on an old one
(several checks of load before). No caller hangs, no request runs twice (the rollback's ghosts
are refused), and no call fails with DataLoss unless it was in flight while a loss happened and
was declared: every call made after a loss is declared runs, after the second and third as
after the first (issue 39, items 1, 2 and 6)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis

from prq.embedded import EmbeddedRedis
from tests.fault.checker import check_nodes
from tests.fault.nodes import NodeFactory, NodeProcess
from tests.fault.redis_faults import flushall, restart_empty, rollback_to_snapshot, snapshot
from tests.fault.scenarios import (
    CHECK_S,
    SLACK_S,
    data_loss_declared,
    events,
    figures,
    hold_fault,
)
from tests.redis_servers import wait_until

pytestmark = pytest.mark.fault

#: Receiver slots and callers per sender: fewer slots than callers, so requests wait queued
#: (a backlog a rollback brings back) while others are held.
SLOTS, CALLERS = 6, 12
SERVICE_MS = 30.0
#: Calls ok before the snapshot: a young endpoint's first calls; an old one's checks of load.
YOUNG_OK, OLD_CHECKS = 10, 4
#: Calls ok that must start after the last loss was surely declared.
AFTER_OK = 40
#: A loss is declared within this long of the moment Redis is back with less data: the check
#: interval and a second (fault scenario 5's bound), or at once when a node's link comes back.
DECLARED_WITHIN_S = CHECK_S + SLACK_S


def _ok_since(senders: list[NodeProcess], since: float) -> int:
    return sum(
        r["outcome"] == "ok" and r["t_mono"] >= since for s in senders for r in events(s, "end")
    )


def _canaries(client: redis.Redis, prefix: str) -> dict[bytes, object]:
    return {key: client.get(key) for key in client.scan_iter(match=f"{prefix}:canary:*")}


def _checked_since(client: redis.Redis, prefix: str, before: dict[bytes, object]) -> bool:
    """Every node stepped its canary since `before` was read (a check came since)."""
    now = _canaries(client, prefix)
    return len(now) >= 4 and all(now[key] != before.get(key) for key in now)


@pytest.mark.parametrize("age", ["young", "old"])
@pytest.mark.parametrize("gap_checks", [1 / 6, 1.0, 2.0], ids=["10s", "60s", "120s"])
@pytest.mark.timeout(120)
def test_losses_in_a_row_let_every_call_made_after_each_declaration_run(
    age: str,
    gap_checks: float,
    nodes: NodeFactory,
    fault_redis: EmbeddedRedis,
    fault_client: redis.Redis,
    fault_prefix: str,
) -> None:
    # Given a receiver and a sender on each facade, under steady load
    receivers = [
        nodes.receiver(
            f"r-{facade}", facade=facade, concurrency=SLOTS, handler="sleep", handler_ms=SERVICE_MS
        )
        for facade in ("async", "sync")
    ]
    senders = [
        nodes.sender(
            f"s-{facade}", facade=facade, concurrency=CALLERS, duration_s=90.0, call_deadline_s=20.0
        )
        for facade in ("async", "sync")
    ]
    if age == "young":
        wait_until(lambda: _ok_since(senders, 0.0) >= YOUNG_OK, 30, 0.02, "first calls")
    else:
        for _ in range(OLD_CHECKS):
            before = _canaries(fault_client, fault_prefix)
            wait_until(
                lambda: _checked_since(fault_client, fault_prefix, before),  # noqa: B023
                10,
                0.02,
                "a check of every node",
            )
    # (a snapshot a check before the losses: a rollback to it is behind the canaries' last step)
    snapshot(fault_redis)
    before = _canaries(fault_client, fault_prefix)
    wait_until(lambda: _checked_since(fault_client, fault_prefix, before), 10, 0.02, "checked")

    # When Redis is flushed, then restarted from that snapshot, then restarted empty, each a
    # gap after the last
    gap_s = gap_checks * CHECK_S
    losses: list[tuple[str, float, float]] = []  # (how, struck, back with less data)
    struck = time.monotonic()
    flushall(fault_redis)
    losses.append(("flush", struck, time.monotonic()))
    later: list[tuple[str, Callable[[EmbeddedRedis], float]]] = [
        ("rollback", rollback_to_snapshot),
        ("restart empty", restart_empty),
    ]
    for how, lose in later:
        hold_fault(gap_s)
        struck = time.monotonic()
        losses.append((how, struck, lose(fault_redis)))

    # And the load goes on until enough calls started after the last loss was declared
    settled = losses[-1][2] + DECLARED_WITHIN_S
    wait_until(lambda: _ok_since(senders, settled) >= AFTER_OK, 40, 0.05, "calls run again")
    for node in (*senders, *receivers):
        assert node.stop() == 0

    # Then no caller hung, nothing ran twice, no ghost ran, every key has a TTL, and no call
    # failed with DataLoss (or was told it may have run) unless it was in flight between a loss
    # and its declaration
    windows = [(struck_at - 0.05, back_at + DECLARED_WITHIN_S) for _, struck_at, back_at in losses]
    result = check_nodes(
        nodes.nodes,
        name=f"S24-{age}-{gap_checks:g}",
        redis_client=fault_client,
        prefix=fault_prefix,
        data_loss_windows=windows,
    )
    print(result.report())
    declared = [len(data_loss_declared(node)) for node in (*senders, *receivers)]
    figures(
        f"S24-{age}-gap{gap_s:.2f}s",
        losses=[(how, round(back - struck, 2)) for how, struck, back in losses],
        declarations_per_node=declared,
        data_loss_errors=result.outcomes.get("DataLoss", 0),
        ok_after_last_loss=_ok_since(senders, settled),
    )
    result.assert_clean(min_calls=YOUNG_OK, max_false_data_loss=0, max_false_maybe_executed=0)
    assert all(n >= 1 for n in declared), "a node never declared the losses"
