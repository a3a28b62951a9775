"""Scenario 1: a receiver killed (kill -9) after pickup; its callers get ReceiverLost within the
receiver timeout + 1 s, and the requests are fenced in Redis (cancelled, reason receiver_lost).
Half the callers wait in `call`, half `send` and wait for the one callback (on_failure)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from tests.fault.checker import check_nodes
from tests.fault.nodes import NodeFactory
from tests.fault.proxy import FaultProxy
from tests.fault.scenarios import (
    POLL_DRIFT_S,
    RECEIVER_TIMEOUT_S,
    SLACK_S,
    ends,
    figures,
    request_hash,
)

pytestmark = pytest.mark.fault

#: Calls held by the receiver when it dies.
HELD = 4


@pytest.mark.parametrize(
    ("receiver_facade", "sender_facade"), [("async", "sync"), ("sync", "async")]
)
def test_receiver_killed_after_pickup(
    nodes: NodeFactory,
    make_proxy: Callable[..., FaultProxy],
    fault_client: redis.Redis,
    fault_prefix: str,
    receiver_facade: str,
    sender_facade: str,
) -> None:
    # Given a receiver (through its own link) holding HELD picked-up calls in a handler that
    # waits on a barrier, and the sender waiting for them
    receiver = nodes.receiver(
        "r1",
        handler="barrier",
        concurrency=2 * HELD,
        facade=receiver_facade,
        redis_url=make_proxy().url,
    )
    # (HELD by call, HELD more by send: the callback must come once, as the call's outcome)
    for name, style in (("s1", "call"), ("s2", "send")):
        nodes.sender(
            name,
            count=HELD,
            concurrency=HELD,
            facade=sender_facade,
            call_style=style,
            call_deadline_s=30,
        )
    receiver.wait_for("start", count=2 * HELD)

    # When the receiver is killed with SIGKILL
    receiver.kill()
    assert receiver.killed_at is not None

    # Then every caller gets ReceiverLost within the receiver timeout + 1 s of the kill
    for sender in nodes.senders:
        assert sender.wait(RECEIVER_TIMEOUT_S + 15) == 0
    result = check_nodes(nodes.nodes, name="S01", redis_client=fault_client, prefix=fault_prefix)
    print(result.report())
    result.assert_clean(min_calls=2 * HELD)
    after_kill = [call.end - receiver.killed_at for call in result.calls if call.end is not None]
    figures(
        "S01",
        facades=f"{receiver_facade}/{sender_facade}",
        held=HELD,
        outcomes=dict(result.outcomes),
        first_lost_after_kill_s=min(after_kill),
        last_lost_after_kill_s=max(after_kill),
        bound_s=RECEIVER_TIMEOUT_S + SLACK_S,
    )
    assert [call.outcome for call in result.calls] == ["ReceiverLost"] * 2 * HELD
    vias = sorted(r["via"] for sender in nodes.senders for r in ends(sender))
    assert vias == ["call"] * HELD + ["on_failure"] * HELD
    assert all(call.maybe_executed and call.retryable for call in result.calls)
    # (the "+ 1 s" is one poll of the caller; see POLL_DRIFT_S for the few ms on top)
    assert max(after_kill) <= RECEIVER_TIMEOUT_S + SLACK_S + POLL_DRIFT_S
    # And each request ran once and is fenced: cancelled as receiver_lost, with no response
    assert sorted(result.executions.values()) == [1] * 2 * HELD
    for call in result.calls:
        fields = request_hash(fault_client, fault_prefix, call.id)
        assert (fields.get("st"), fields.get("why")) == ("cancelled", "receiver_lost"), fields
        assert "rsp" not in fields
