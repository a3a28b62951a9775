"""Scenario 14 (issue 15, item 0): receiver processes stopped while idle, one after another, under
a steady call load with two live receivers beside them. A receiver waiting for work has parked
takes that enqueues hand requests straight to; one that dies (SIGKILL) leaves those parks behind,
and a hand-off to them must go to a live receiver once its confirmation window passes, never be
reported "maybe executed". One stopped by SIGTERM withdraws its parks and leaves at once: the
SIGTERM victims serve as the README's quickstart receiver does (a plain `serve` in the main
thread), so stopping them is prq's own doing.

Every call succeeds, none waits past the confirmation window and two poll intervals (the caller's
poll that takes the hand-off back, and one more), and no caller hears "maybe executed" about a
request no ledger shows started. The stopped receivers park for 5 s (the production poll
interval), so their parks outlive them as they would in production; each is caught idle before
it is stopped (a SIGKILL victim frozen at a moment Redis shows it holding nothing, so no caller
of it may hear "maybe executed"; a SIGTERM victim when Redis shows it holding nothing).
"""

from __future__ import annotations

import time
from functools import partial

import pytest
import redis

from tests.fault.checker import check_nodes
from tests.fault.nodes import NodeFactory, NodeProcess
from tests.fault.scenarios import (
    CONFIRM_S,
    POLL_DRIFT_S,
    POLL_S,
    data_loss_declared,
    figures,
    freeze_when,
    held_by,
    starts,
    steady_for,
)
from tests.redis_servers import wait_until

pytestmark = pytest.mark.fault

#: Every node of the scenario: the shrunk hand-off confirmation window.
CONFIRMING = {"handoff_confirm_s": CONFIRM_S}
#: The receivers that are stopped park their takes this long (production's poll interval).
LONG_PARKS = {**CONFIRMING, "poll_interval_s": 5.0}
#: Takes each receiver parks at once (a dead one could swallow this many calls).
SLOTS = 4
#: Receivers stopped, one after another, alternating facades.
STOPPED = 4
#: Load between two stops, seconds (the schedule's own pause).
BETWEEN_S = 2.0
#: Handler time, ms.
SERVICE_MS = 20.0
#: The longest any call may take: the confirmation window, the caller's poll that takes a
#: hand-off back, one more poll (see POLL_DRIFT_S for the few ms on top).
CALL_BOUND_S = CONFIRM_S + 2 * POLL_S + POLL_DRIFT_S


def _idle(client: redis.Redis, prefix: str, receiver: NodeProcess) -> bool:
    return not held_by(client, prefix, receiver.name)


def _serving(receiver: NodeProcess, count: int = 1) -> None:
    """Wait (bounded) until `receiver` has run `count` more calls of the load."""
    before = len(starts(receiver))
    wait_until(lambda: len(starts(receiver)) >= before + count, 20, 0.02, f"{receiver.name} runs")


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
@pytest.mark.timeout(120)
def test_receivers_stopped_while_idle_swallow_no_call(
    nodes: NodeFactory, fault_client: redis.Redis, fault_prefix: str, how: str
) -> None:
    # Given two live receivers (one per facade) and a steady load of calls and sends
    for name, facade in (("live-async", "async"), ("live-sync", "sync")):
        nodes.receiver(
            name,
            facade=facade,
            concurrency=SLOTS,
            handler="sleep",
            handler_ms=SERVICE_MS,
            queue_settings=CONFIRMING,
        )
    for name, facade, style in (("s1", "async", "call"), ("s2", "sync", "send")):
        nodes.sender(
            name,
            facade=facade,
            call_style=style,
            concurrency=4,
            think_ms=100,
            duration_s=90,
            call_deadline_s=20,
            queue_settings=CONFIRMING,
        )
    stops = []
    picked_up: set[str] = set()
    for n in range(STOPPED):
        # When a third receiver joins, serves some calls, and is stopped at an idle moment
        victim = nodes.receiver(
            f"v{n}",
            facade=("async", "sync")[n % 2],
            concurrency=SLOTS,
            handler="sleep",
            handler_ms=SERVICE_MS,
            queue_settings=LONG_PARKS,
            plain_serve=how == "SIGTERM",
        )
        _serving(victim, 3)
        if how == "SIGKILL":
            picked_up |= freeze_when(victim, fault_client, fault_prefix, busy=False)
            stops.append(time.monotonic())
            victim.kill()
        else:
            wait_until(partial(_idle, fault_client, fault_prefix, victim), 10, 0.005, "idle")
            stops.append(time.monotonic())
            assert victim.stop() == 0, victim.log_tail()
        # (and the load runs on with the live receivers alone)
        steady_for(BETWEEN_S)

    for sender in nodes.senders:
        assert sender.stop() == 0
    for receiver in nodes.receivers:
        receiver.stop()

    # Then every call succeeded, none waited past the bound, and nobody heard "maybe executed"
    result = check_nodes(nodes.nodes, name="S14", redis_client=fault_client, prefix=fault_prefix)
    print(result.report())
    slowest = max((c.latency_ms or 0.0) / 1000.0 for c in result.calls)
    after_stops = [c for c in result.calls if c.start >= stops[0]]
    figures(
        "S14",
        how=how,
        stopped=STOPPED,
        calls=len(result.calls),
        calls_after_first_stop=len(after_stops),
        slower_than_confirm_window=sum(
            (c.latency_ms or 0.0) > CONFIRM_S * 1000.0 for c in result.calls
        ),
        slowest_s=slowest,
        bound_s=CALL_BOUND_S,
        held_when_stopped=len(picked_up),
    )
    result.assert_clean(min_calls=100, max_false_maybe_executed=0, max_false_data_loss=0)
    assert picked_up == set(), "freeze_when caught a receiver holding work as idle"
    assert dict(result.outcomes) == {"ok": len(result.calls)}
    assert slowest <= CALL_BOUND_S
    assert not any(data_loss_declared(node) for node in nodes.nodes)
