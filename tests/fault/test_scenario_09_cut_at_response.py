"""Scenario 9: the sender's connection is cut exactly when the response is applied: the sender
still gets its response.

"Exactly when" is made deterministic: the sender's link is blackholed (nothing flows either way,
nothing is reset) just before the handler returns, so the response is stored in Redis and its
pulse is published while the sender cannot hear it; then the link is cut (RST: the held pulse
and any held read are lost) and restored. The sender must find the response by itself: as
`call`'s return, or as `send`'s one on_response."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from tests.fault.checker import check_nodes
from tests.fault.nodes import NodeFactory
from tests.fault.proxy import FaultProxy
from tests.fault.scenarios import POLL_S, SLACK_S, ends, figures, wait_request_state

pytestmark = pytest.mark.fault

#: Calls, one after the other, each cut at its response.
CALLS = 3
#: Longest pause between two reconnect attempts of a node (prq's retry and pub/sub backoffs
#: both cap at 2 s).
RECONNECT_S = 2.0


@pytest.mark.parametrize(
    ("facade", "style"), [("async", "call"), ("sync", "call"), ("async", "send"), ("sync", "send")]
)
def test_sender_cut_when_the_response_is_applied(
    nodes: NodeFactory,
    make_proxy: Callable[..., FaultProxy],
    fault_client: redis.Redis,
    fault_prefix: str,
    facade: str,
    style: str,
) -> None:
    # Given a sender on its own link, calling a receiver whose handler waits on a barrier
    link = make_proxy()
    receiver = nodes.receiver("r1", handler="barrier")
    sender = nodes.sender(
        "s1",
        facade=facade,
        call_style=style,
        count=CALLS,
        call_deadline_s=20,
        redis_url=link.url,
    )
    barrier = Path(receiver.config.barrier_path)
    recoveries = []
    for n in range(1, CALLS + 1):
        request_id = receiver.wait_for("start", count=n)[-1]["id"]

        # When the sender's link goes silent, the handler returns and the response is applied
        link.blackhole()
        barrier.touch()
        wait_request_state(fault_client, fault_prefix, request_id, ("done",))
        # And the link is then cut (the pulse it held is lost) and restored
        cut = link.cut()
        barrier.unlink()  # the next call waits again (this one's handler has returned)
        link.restore()
        restored_at = time.monotonic()

        # Then the sender still gets the response
        record = sender.wait_for("end", count=n, timeout_s=15)[-1]
        assert record["id"] == request_id
        assert (record["outcome"], record["tag_ok"]) == ("ok", True), record
        recoveries.append((record["t_mono"] - restored_at, cut))

    assert sender.wait(15) == 0
    result = check_nodes(nodes.nodes, name="S09", redis_client=fault_client, prefix=fault_prefix)
    print(result.report())
    figures(
        "S09",
        facade=facade,
        style=style,
        calls=CALLS,
        connections_cut=[cut for _, cut in recoveries],
        response_after_restore_s=[round(seconds, 3) for seconds, _ in recoveries],
        pubsub_frames_dropped=link.dropped_frames,
    )
    result.assert_clean(min_calls=CALLS, min_success_rate=1.0)
    assert [r["outcome"] for r in ends(sender)] == ["ok"] * CALLS
    assert {r["via"] for r in ends(sender)} == {"on_response" if style == "send" else "call"}
    # (it polls: the response comes within a reconnect and a poll interval of the restore)
    assert all(seconds <= RECONNECT_S + POLL_S + SLACK_S for seconds, _ in recoveries)
