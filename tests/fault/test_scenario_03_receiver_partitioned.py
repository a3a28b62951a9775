"""Scenario 3: a receiver loses Redis for good after pickup. Its caller gets ReceiverLost. A
request sent right after the cut is handed to the cut-off receiver's parked take, which can
never confirm it (issue 15, item 0): a hand-off is no pickup, so it goes back to the queue once
its confirmation window passes and, with no other receiver, its caller gets PickupTimeout at
its pickup deadline, told truly that it never ran (by `call`, or by `send`'s on_failure), not
ReceiverLost after the receiver timeout. The callers' pickup timeout (3 s) is set BELOW the
receiver timeout (5 s), so the two outcomes cannot be mistaken for each other."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis

from prq.core.keys import KeySchema
from tests.fault.checker import check_nodes
from tests.fault.nodes import NodeFactory
from tests.fault.proxy import FaultProxy
from tests.fault.scenarios import (
    ENDPOINT,
    POLL_DRIFT_S,
    POLL_S,
    RECEIVER_TIMEOUT_S,
    SLACK_S,
    figures,
    request_hash,
    wait_request_state,
)
from tests.redis_servers import server_ms, wait_until

pytestmark = pytest.mark.fault

#: The callers' pickup timeout, below the receiver timeout on purpose (module docstring).
PICKUP_S = 3.0
#: A park must have at least this long to run when the link is cut, so that the request sent
#: right after the cut is surely handed to it (the receiver re-parks every poll interval).
PARK_LEFT_MS = 500


def _live_park_ms(client: redis.Redis, prefix: str, node: str) -> int:
    """How long the receiver `node`'s longest park has left by server time (ms; 0: none)."""
    parks: dict[bytes, bytes] = client.hgetall(KeySchema(prefix).endpoint(ENDPOINT).parks)  # type: ignore[assignment]
    now_ms = server_ms(client)
    left = [
        int(until) - now_ms
        for who, _, until in (value.decode().partition("|") for value in parks.values())
        if who == node
    ]
    return max([0, *left])


@pytest.mark.parametrize("style", ["call", "send"])
def test_receiver_loses_redis_forever_after_pickup(
    nodes: NodeFactory,
    make_proxy: Callable[..., FaultProxy],
    fault_client: redis.Redis,
    fault_prefix: str,
    style: str,
) -> None:
    # Given a receiver on its own link with two slots: one runs call A (waiting on a barrier),
    # the other is parked in a take
    link = make_proxy()
    receiver = nodes.receiver("r1", handler="barrier", concurrency=2, redis_url=link.url)
    pickup = {"pickup_timeout_s": PICKUP_S}
    first = nodes.sender("s1", count=1, call_deadline_s=30, queue_settings=pickup, call_style=style)
    second = nodes.sender(
        "s2",
        call_style=style,
        count=1,
        call_deadline_s=30,
        queue_settings=pickup,
        go_path=str(nodes.workdir / "s2.go"),
    )
    receiver.wait_for("start")
    wait_until(
        lambda: _live_park_ms(fault_client, fault_prefix, "r1") >= PARK_LEFT_MS,
        10,
        0.005,
        "receiver r1 parked with time to run",
    )

    # When the receiver's link is cut for good, and call B is sent right after (to the park)
    link.cut()
    cut_at = time.monotonic()
    second.go()
    call_b_id = second.wait_for("start")[0]["id"]
    handed = wait_request_state(fault_client, fault_prefix, call_b_id, ("handed",))

    # Then caller A gets ReceiverLost, and caller B PickupTimeout
    assert first.wait(RECEIVER_TIMEOUT_S + 15) == 0
    assert second.wait(RECEIVER_TIMEOUT_S + 15) == 0
    result = check_nodes(nodes.nodes, name="S03", redis_client=fault_client, prefix=fault_prefix)
    print(result.report())
    result.assert_clean(min_calls=2, max_false_maybe_executed=0)
    call_a = next(c for c in result.calls if c.node == "s1")
    call_b = next(c for c in result.calls if c.node == "s2")
    assert call_a.end is not None and call_b.end is not None
    figures(
        "S03",
        style=style,
        outcome_a=call_a.outcome,
        outcome_b=call_b.outcome,
        b_handed_to=handed.get("rcv"),
        a_lost_after_cut_s=call_a.end - cut_at,
        b_ended_after_send_s=call_b.end - call_b.start,
        bound_a_s=RECEIVER_TIMEOUT_S + SLACK_S,
        bound_b_s=PICKUP_S + POLL_S,
        b_executions=result.executions[call_b.id],
    )
    # B was handed to the cut-off receiver's take, never ran, and its caller was told so
    assert handed.get("rcv") == "r1", handed
    assert result.executions[call_b.id] == 0
    assert (call_a.outcome, call_b.outcome) == ("ReceiverLost", "PickupTimeout")
    assert call_b.maybe_executed is False
    fields = request_hash(fault_client, fault_prefix, call_a.id)
    assert (fields.get("st"), fields.get("why")) == ("cancelled", "receiver_lost"), fields
    # A within the receiver timeout + 1 s of the cut (its last beat came before the cut); B
    # within a poll of its pickup deadline (judged on the caller's polls)
    assert call_a.end - cut_at <= RECEIVER_TIMEOUT_S + SLACK_S + POLL_DRIFT_S
    assert call_b.end - call_b.start <= PICKUP_S + POLL_S + POLL_DRIFT_S
