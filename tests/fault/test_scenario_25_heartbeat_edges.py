"""Scenario 25: a handler that outlasts both timeouts, between node processes, under every edge of
the heartbeat settings QueueSettings accepts (a first beat at once, one interval in, at its
largest; an interval at its largest; each timeout the shorter; heartbeats derived from the
timeouts), a sender and a receiver of their own per case, the facades crossed. Every call gets
its answer: no caller is declared lost (`sender_lost`), no receiver (`ReceiverLost`), nothing
is told it may have run, nothing runs twice (issue 39, item 3: with a first beat at once the
caller never beat, and was declared lost one sender timeout after the take).

All cases run at once, so the scenario costs about one long call and the nodes' start."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from tests.fault.checker import check_nodes
from tests.fault.nodes import NodeFactory
from tests.fault.scenarios import figures
from tests.integration.test_heartbeat_settings import CASES

pytestmark = pytest.mark.fault

#: Calls per case, all at once (each holds the receiver past both timeouts).
CALLS = 2
#: The handler runs this long past the longer of the two timeouts.
PAST_TIMEOUTS_S = 1.0


def _timings(case: dict[str, Any]) -> dict[str, Any]:
    """The fault bed's timings with the case's heartbeats and timeouts (polls, pickup and the
    check interval as the bed has them)."""
    timings = dict(case)
    # (heartbeats the case leaves unset are derived from its timeouts, not the bed's: None
    # removes the bed's value, NodeFactory.config)
    timings.setdefault("heartbeat_initial_delay_s", None)
    timings.setdefault("heartbeat_interval_s", None)
    return timings


@pytest.mark.timeout(120)
def test_a_handler_outlasting_both_timeouts_answers_under_every_heartbeat_edge(
    nodes: NodeFactory, fault_client: redis.Redis, fault_prefix: str
) -> None:
    # Given, for every case, a receiver whose handler runs past both timeouts and a sender
    # that makes two calls at once (a receiver of one facade, a sender of the other)
    pairs = []
    for n, (name, case) in enumerate(CASES.items()):
        endpoint = f"poll://edge-{n}"
        timings = _timings(case)
        longest = max(case["receiver_timeout_s"], case["sender_timeout_s"])
        facades = ("async", "sync") if n % 2 else ("sync", "async")
        receiver = nodes.receiver(
            f"r{n}", facade=facades[0], endpoint=endpoint, concurrency=CALLS, handler="sleep",
            handler_ms=(longest + PAST_TIMEOUTS_S) * 1000, queue_settings=timings,
        )  # fmt: skip
        sender = nodes.sender(
            f"s{n}", facade=facades[1], endpoint=endpoint, concurrency=CALLS, count=CALLS,
            call_deadline_s=30.0, queue_settings=timings,
        )  # fmt: skip
        pairs.append((name, receiver, sender))

    # When every call has ended
    for name, _, sender in pairs:
        assert sender.wait(60) == 0, f"{name}: the sender did not finish its calls"
    for _, receiver, _ in pairs:
        assert receiver.stop() == 0

    # Then every call got its answer: nobody was declared lost, nothing may have run twice
    result = check_nodes(nodes.nodes, name="S25", redis_client=fault_client, prefix=fault_prefix)
    print(result.report())
    by_case = {
        name: sorted(c.outcome or "unfinished" for c in result.calls if c.node == sender.name)
        for name, _, sender in pairs
    }
    figures("S25", cases=len(pairs), outcomes=by_case)
    result.assert_clean(min_calls=CALLS * len(pairs), min_success_rate=1.0)
    assert all(outcomes == ["ok"] * CALLS for outcomes in by_case.values()), by_case
