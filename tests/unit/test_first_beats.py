"""A caller's lease begins before its enqueue is sent, so its first beat can reach Redis before
the request does (a first-beat delay of 0, or an enqueue slowed by retries). "missing" then means
"not written yet": the lease goes on beating, or the caller would wait without beats and its
receiver would cancel the request (sender_lost) one sender timeout after the take."""

from __future__ import annotations

from prq import QueueSettings
from prq.core.keys import KeySchema
from prq.node.heartbeats import Liveness
from prq.protocol.effects import Reply
from prq.protocol.flows.context import Context

SETTINGS = QueueSettings(
    heartbeat_initial_delay_s=0,
    heartbeat_interval_s=0.2,
    receiver_timeout_s=2,
    sender_timeout_s=2,
)


def beat_reply(state: str) -> Reply:
    reply: list[Reply] = [state.encode(), b"", b""]
    return reply


def test_a_callers_beat_that_finds_its_request_not_yet_written_keeps_the_lease() -> None:
    # Given a call whose first beat is due at once, sent before its enqueue reached Redis
    liveness = Liveness(Context(KeySchema("prq"), SETTINGS, "node"))
    liveness.send("s-1", "poll://first-beat", 100.0)
    (lease, _call), *_ = liveness.due(100.0)

    # When that beat finds nothing stored under the id
    ended = liveness.settle([lease], [beat_reply("missing")])

    # Then the call is not over: it keeps its lease, and beats again one interval later
    assert ended == []
    assert "s-1" in liveness.sent
    assert [lease.request_id for lease, _ in liveness.due(100.2)] == ["s-1"]


def test_a_callers_request_found_once_and_then_missing_is_lost() -> None:
    # Given a call whose beat found its request queued, then taken
    liveness = Liveness(Context(KeySchema("prq"), SETTINGS, "node"))
    liveness.send("s-1", "poll://first-beat", 100.0)
    for now, state in ((100.0, "queued"), (100.2, "taken")):
        leases = [lease for lease, _ in liveness.due(now)]
        assert liveness.settle(leases, [beat_reply(state)]) == []

    # When a later beat finds nothing stored under the id
    leases = [lease for lease, _ in liveness.due(100.4)]
    ended = liveness.settle(leases, [beat_reply("missing")])

    # Then Redis lost it: the call ends (its caller reads DataLoss)
    assert [(v.lease.request_id, v.reason) for v in ended] == [("s-1", "data_loss")]
