"""Scenario 6: Redis paused (SIGSTOP). A pause inside the retry budget (5 s, budget 30 s) is ridden
out: no call fails, nothing runs twice. A pause past the budget (10 s, budget 5 s) ends every
affected call with QueueUnavailable within budget + socket timeout + 1 s, and no ghost. Some
senders `send` instead of `call`: each send gets exactly one callback, with the same outcome."""

from __future__ import annotations

import time

import pytest
import redis

from prq.embedded import EmbeddedRedis
from tests.fault.checker import check_nodes
from tests.fault.nodes import NodeFactory
from tests.fault.redis_faults import paused
from tests.fault.scenarios import (
    POLL_S,
    SLACK_S,
    SOCKET_TIMEOUT_S,
    data_loss_declared,
    events,
    figures,
    hold_fault,
    ok_since,
)
from tests.redis_servers import wait_until

pytestmark = pytest.mark.fault

#: Handler time, ms.
SERVICE_MS = 20.0
#: The senders: (facade, call style, callers); `send` callers wait for the one callback.
SENDERS = (("async", "call", 8), ("sync", "call", 8), ("async", "send", 4), ("sync", "send", 4))
#: The receiver's slots: one per caller.
SLOTS = sum(callers for _, _, callers in SENDERS)
#: Calls ok before the pause (steady load) and after it (the load goes on).
WARM_OK, AFTER_OK = 50, 50


@pytest.mark.timeout(90)
def test_redis_paused_within_the_budget_fails_nothing(
    nodes: NodeFactory, fault_redis: EmbeddedRedis, fault_client: redis.Redis, fault_prefix: str
) -> None:
    pause_s, budget_s = 5.0, 30.0
    budget = {"retry_budget_s": budget_s}
    # Given a receiver and four senders (call and send, one per facade) under steady load,
    # retry budget 30 s
    receiver = nodes.receiver(
        "r1", concurrency=SLOTS, handler="sleep", handler_ms=SERVICE_MS, queue_settings=budget
    )
    senders = [
        nodes.sender(
            f"s{n}",
            facade=facade,
            call_style=style,
            concurrency=callers,
            duration_s=60.0,
            call_deadline_s=budget_s,
            queue_settings=budget,
        )
        for n, (facade, style, callers) in enumerate(SENDERS, start=1)
    ]
    wait_until(lambda: ok_since(senders, 0.0) >= WARM_OK, 30, 0.05, "steady load")

    # When Redis is paused for 5 s
    with paused(fault_redis):
        paused_at = time.monotonic()
        hold_fault(pause_s)
    resumed_at = time.monotonic()

    # And the load goes on for a while after it
    wait_until(lambda: ok_since(senders, resumed_at) >= AFTER_OK, 30, 0.05, "calls after")
    for sender in senders:
        assert sender.stop() == 0
    assert receiver.stop() == 0

    # Then no call failed and no request ran twice
    result = check_nodes(nodes.nodes, name="S06-5s", redis_client=fault_client, prefix=fault_prefix)
    print(result.report())
    across = [c for c in result.calls if c.start < resumed_at and (c.end or 0) > paused_at]
    declared = [line for node in nodes.nodes for line in data_loss_declared(node)]
    figures(
        "S06-5s",
        pause_s=resumed_at - paused_at,
        budget_s=budget_s,
        calls_across_the_pause=len(across),
        slowest_across_s=max(((c.end or 0) - c.start for c in across), default=0.0),
        failed=sum(1 for c in result.finished_calls if not c.ok),
        outcomes=dict(result.outcomes),
        false_data_loss_declarations=len(declared),
    )
    assert across, "no call was in flight during the pause"
    result.assert_clean(min_calls=WARM_OK + AFTER_OK, min_success_rate=1.0)
    assert result.success_rate() == 1.0
    # And no node declared data loss: Redis lost nothing (a false declaration fails whatever
    # calls happen to be in flight at that moment with DataLoss)
    assert declared == []


@pytest.mark.timeout(90)
def test_redis_paused_past_the_budget_ends_calls_with_queue_unavailable(
    nodes: NodeFactory, fault_redis: EmbeddedRedis, fault_client: redis.Redis, fault_prefix: str
) -> None:
    # A short budget, and a pause well past it (budget 5 s, pause 10 s)
    pause_s, budget_s = 10.0, 5.0
    bound_s = budget_s + SOCKET_TIMEOUT_S + SLACK_S
    budget = {"retry_budget_s": budget_s}
    # Given a receiver and four senders (call and send, one per facade) under steady load
    receiver = nodes.receiver(
        "r1", concurrency=SLOTS, handler="sleep", handler_ms=SERVICE_MS, queue_settings=budget
    )
    senders = [
        nodes.sender(
            f"s{n}",
            facade=facade,
            call_style=style,
            concurrency=callers,
            duration_s=60.0,
            call_deadline_s=bound_s + POLL_S,
            queue_settings=budget,
        )
        for n, (facade, style, callers) in enumerate(SENDERS, start=1)
    ]
    wait_until(lambda: ok_since(senders, 0.0) >= WARM_OK, 30, 0.05, "steady load")

    # When Redis is paused for 10 s
    with paused(fault_redis):
        paused_at = time.monotonic()
        hold_fault(pause_s)
        # (the calls that ended while Redis was still paused: every affected call should be one,
        # as the bound is shorter than the pause)
        ended = [c for s in senders for c in events(s, "end") if c["t_mono"] >= paused_at]
    resumed_at = time.monotonic()
    wait_until(lambda: ok_since(senders, resumed_at) >= 10, 30, 0.05, "calls after the pause")
    for sender in senders:
        assert sender.stop() == 0
    assert receiver.stop() == 0

    # Then every call whose budget ran out during the pause ended with QueueUnavailable, within
    # budget + socket timeout + 1 s of when it first met the pause (its start, or the pause
    # itself; a caller that was waiting for a pulse meets it at its next poll, up to one poll
    # interval later)
    result = check_nodes(
        nodes.nodes, name="S06-past", redis_client=fault_client, prefix=fault_prefix
    )
    print(result.report())
    hit = [c for c in result.calls if c.start < resumed_at and (c.end or resumed_at) > paused_at]
    started_during = [c for c in hit if c.start >= paused_at]
    in_flight = [c for c in hit if c.start < paused_at]
    late_started = [(c.end or 0) - c.start for c in started_during]
    late_in_flight = [(c.end or 0) - paused_at for c in in_flight]
    # (the longest calls begun during the pause, seconds from its start: a failure names them)
    for call in sorted(started_during, key=lambda c: (c.end or resumed_at) - c.start)[-3:]:
        print(
            f"[S06-past] started during: sender={call.node} start={call.start - paused_at:.3f} "
            f"end={(call.end or resumed_at) - paused_at:.3f} outcome={call.outcome}"
        )
    figures(
        "S06-past",
        pause_s=resumed_at - paused_at,
        budget_s=budget_s,
        bound_s=bound_s,
        affected=len(hit),
        outcomes_affected=sorted({c.outcome or "-" for c in hit}),
        ended_while_paused=len(ended),
        worst_started_during_s=max(late_started, default=0.0),
        worst_in_flight_from_pause_s=max(late_in_flight, default=0.0),
        ok_after_resume=ok_since(senders, resumed_at),
    )
    assert hit, "no call met the pause"
    # (no ghost, no hang, no duplicate)
    result.assert_clean(min_calls=WARM_OK)
    # A call whose whole budget fell inside the pause must have failed; one that began less than
    # a budget before Redis came back may rightly succeed (riding out outages is the budget's job)
    # (an in-flight call that ended within half a second of the pause used replies Redis had
    # already sent: the pause did not touch it)
    doomed = [
        c
        for c in in_flight
        if paused_at + bound_s + POLL_S < resumed_at and (c.end or resumed_at) > paused_at + 0.5
    ]
    doomed += [c for c in started_during if c.start + bound_s < resumed_at]
    assert doomed, "no call had its whole budget inside the pause"
    assert {c.outcome for c in doomed} == {"QueueUnavailable"}
    assert {c.outcome for c in hit} <= {"QueueUnavailable", "ok"}
    assert all(c.retryable for c in hit if c.outcome != "ok")
    assert (
        max(((c.end or 0) - c.start for c in doomed if c in started_during), default=0) <= bound_s
    )
    assert max(late_in_flight, default=0.0) <= bound_s + POLL_S
    assert len(ended) >= len(doomed)  # they all ended while Redis was still paused
