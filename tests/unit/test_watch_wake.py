"""A new lease wakes the node's watch loop when its first beat is due before the loop would
wake by itself: with a first-beat delay shorter than the poll interval, the beat must not wait
for the loop's sleep (a live receiver would be judged silent before its first beat)."""

from __future__ import annotations

from typing import Any

import pytest

from prq import QueueSettings, Request
from prq.core.keys import KeySchema
from prq.core.lifecycle import DeliveryInfo, PendingRequest
from prq.node.watch import NodeWatch
from prq.protocol.flows.context import Context
from prq.transport.pulse_router import PulseRouter
from prq.transport.signals import ThreadSignal


class Watch:
    """A node's watch (no I/O) and how often it woke its loop."""

    def __init__(self, **settings: Any) -> None:
        ctx = Context(KeySchema("prq"), QueueSettings(**settings), "node")
        self.watch = NodeWatch(ctx, PulseRouter("prq:node:node", ThreadSignal))
        # (its data-loss check and presence report were made: neither is due for long)
        self.watch.data_loss.next_check = self.watch.presence.next_report = 1000.0
        self.wakes = 0
        self.watch.wake = self._woken

    def _woken(self) -> None:
        self.wakes += 1


def pending(request_id: str = "r-1") -> PendingRequest:
    request = Request(endpoint="poll://wake", method="m", id=request_id)
    return PendingRequest(request, DeliveryInfo(attempt=1, delivery_hash="h"), "token")


#: The loop sleeps up to 5 s; a first beat is due 0.2 s after a lease begins.
QUICK_FIRST_BEAT: dict[str, Any] = {
    "poll_interval_s": 5.0,
    "receiver_timeout_s": 1.0,
    "heartbeat_initial_delay_s": 0.2,
}


def test_a_request_held_while_the_loop_sleeps_wakes_it_for_its_first_beat() -> None:
    # Given a watch loop gone to sleep with nothing due for 5 s
    node = Watch(**QUICK_FIRST_BEAT)
    assert node.watch.wait_s(100.0) == pytest.approx(5.0)

    # When the node takes a request, Then the loop is woken: its first beat is due in 0.2 s
    node.watch.hold(pending(), 100.1)
    assert node.wakes == 1
    # ... and the turn it runs then sleeps only until that beat
    assert node.watch.wait_s(100.1) == pytest.approx(0.2)
    assert [lease.request_id for lease, _ in node.watch.liveness.due(100.3)] == ["r-1"]


@pytest.mark.parametrize("lease", ["sent", "adopted again"])
def test_a_call_sent_or_a_redelivery_adopted_wakes_the_loop_too(lease: str) -> None:
    node = Watch(**QUICK_FIRST_BEAT)
    node.watch.wait_s(100.0)
    if lease == "sent":
        node.watch.send("s-1", "poll://wake", 100.1)
    else:
        node.watch.liveness.hold(pending(), 99.0)
        node.watch.beat_soon("r-1", 100.1)
    assert node.wakes == 1


def test_a_lease_due_no_earlier_than_the_loops_own_wake_does_not_wake_it() -> None:
    # Given production timings: the loop wakes every 5 s, first beats come after 7 s
    node = Watch(poll_interval_s=5.0)
    node.watch.wait_s(100.0)
    # When requests are taken and sent, Then the loop is left asleep (it wakes in time)
    node.watch.hold(pending(), 100.1)
    node.watch.send("s-1", "poll://wake", 100.2)
    assert node.wakes == 0
    # And so is a loop already woken for an earlier beat, for leases due after that one
    node = Watch(**QUICK_FIRST_BEAT)
    node.watch.wait_s(100.0)
    node.watch.hold(pending("r-1"), 100.1)
    node.watch.wait_s(100.1)
    node.watch.hold(pending("r-2"), 100.2)
    assert node.wakes == 1


def test_a_request_held_while_the_loop_works_out_its_sleep_wakes_it() -> None:
    # Given a loop that is working out how long to sleep (its sleep may not count a lease
    # taken meanwhile by another thread)
    node = Watch(**QUICK_FIRST_BEAT)
    liveness = node.watch.liveness
    next_due_in = liveness.next_due_in

    def held_meanwhile(now: float) -> float:
        wait = next_due_in(now)  # (read before the request is held)
        node.watch.hold(pending(), now)
        return wait

    liveness.next_due_in = held_meanwhile  # type: ignore[method-assign]
    # When a request is held just then, Then the loop is woken (its sleep ends at once)
    assert node.watch.wait_s(100.0) == pytest.approx(5.0)
    assert node.wakes == 1
