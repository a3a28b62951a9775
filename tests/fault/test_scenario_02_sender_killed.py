"""Scenario 2: a sender killed while it waits after pickup; the receiver's PendingRequest is
cancelled with reason sender_lost within the sender timeout + 1 s, and the response the handler
then gives is dropped (the request stays cancelled in Redis)."""

from __future__ import annotations

import pytest
import redis

from tests.fault.checker import check_nodes
from tests.fault.nodes import NodeFactory
from tests.fault.scenarios import (
    POLL_DRIFT_S,
    SENDER_TIMEOUT_S,
    SLACK_S,
    events,
    figures,
    request_hash,
)
from tests.redis_servers import wait_until

pytestmark = pytest.mark.fault

#: Calls picked up when their sender dies.
HELD = 3


@pytest.mark.parametrize(
    ("facade", "in_thread"), [("async", False), ("async", True), ("sync", True)]
)
def test_sender_killed_while_waiting_after_pickup(
    nodes: NodeFactory,
    fault_client: redis.Redis,
    fault_prefix: str,
    facade: str,
    in_thread: bool,
) -> None:
    # Given a receiver whose handlers wait (until released or cancelled), holding HELD calls
    receiver = nodes.receiver(
        "r1", handler="barrier", concurrency=HELD, facade=facade, handler_in_thread=in_thread
    )
    sender = nodes.sender("s1", count=HELD, concurrency=HELD, call_deadline_s=30)
    held = receiver.wait_for("start", count=HELD)

    # When the sender is killed with SIGKILL while it waits for them
    sender.kill()
    assert sender.killed_at is not None

    # Then the receiver sees each request cancelled with reason sender_lost within the sender
    # timeout + 1 s (its handler records that and returns)
    cancelled = receiver.wait_for("cancelled", count=HELD, timeout_s=SENDER_TIMEOUT_S + 10)
    after_kill = [record["t_mono"] - sender.killed_at for record in cancelled]
    receiver.wait_for("end", count=HELD)
    figures(
        "S02",
        facade=facade,
        handler_in_thread=in_thread,
        reasons=sorted({record["reason"] for record in cancelled}),
        first_cancel_after_kill_s=min(after_kill),
        last_cancel_after_kill_s=max(after_kill),
        bound_s=SENDER_TIMEOUT_S + SLACK_S,
    )
    assert [record["reason"] for record in cancelled] == ["sender_lost"] * HELD
    # (the "+ 1 s" is one look of the receiver; see POLL_DRIFT_S for the few ms on top)
    assert max(after_kill) <= SENDER_TIMEOUT_S + SLACK_S + POLL_DRIFT_S
    # And the handlers' responses were dropped: each request stays cancelled, with no response
    ids = {record["id"] for record in held}
    for request_id in ids:
        fields = request_hash(fault_client, fault_prefix, request_id)
        assert (fields.get("st"), fields.get("why")) == ("cancelled", "sender_lost"), fields
        assert "rsp" not in fields
    # And the receiver lives on and holds nothing: with its barrier open it answers a new caller
    nodes.release_barriers()
    again = nodes.sender("s2", count=1, call_deadline_s=10)
    assert again.wait(15) == 0
    assert [r["outcome"] for r in events(again, "end")] == ["ok"]
    result = check_nodes(nodes.nodes, name="S02", redis_client=fault_client, prefix=fault_prefix)
    print(result.report())
    result.assert_clean(min_calls=HELD + 1)
    wait_until(lambda: receiver.alive, 1, message="receiver still serving")
