"""Scenario 17 (issue 15, item 3): a handler whose answer cannot be written. The receiver takes
answers of at most 2,000 bytes (`max_body_bytes`); some calls ask for an echo 5,000 bytes long.
Such a caller, waiting with no timeout of its own (by `call`, or by `send` and its callback),
gets a RemoteError promptly, whose ServerError says the answer was too large, instead of
waiting for as long as the receiver lives (it kept the request and beat for it). The receiver
holds nothing afterwards, and the calls around them succeed.
"""

from __future__ import annotations

import pytest
import redis

from tests.fault.checker import check_nodes
from tests.fault.nodes import NodeFactory
from tests.fault.scenarios import POLL_S, SLACK_S, ends, figures, held_by
from tests.redis_servers import wait_until

pytestmark = pytest.mark.fault

#: The receiver's limit on what it writes, and the size of the answers asked for.
SMALL = {"max_body_bytes": 2000, "inline_limit_bytes": 1000}
ANSWER_PAD = 5000
#: Calls asking for a too large answer.
BIG = 4
#: How soon such a caller must hear of it: the error answer is written at once, and read by
#: the caller on its pulse or, were that lost, its next poll.
PROMPT_S = POLL_S + SLACK_S


@pytest.mark.parametrize(
    ("receiver_facade", "sender_facade", "call_style"),
    [("async", "sync", "send"), ("sync", "async", "call")],
)
@pytest.mark.timeout(90)
def test_an_answer_over_max_body_bytes_ends_the_call_promptly(
    nodes: NodeFactory,
    fault_client: redis.Redis,
    fault_prefix: str,
    receiver_facade: str,
    sender_facade: str,
    call_style: str,
) -> None:
    # Given a receiver that writes answers of at most 2,000 bytes, under a steady load
    receiver = nodes.receiver(
        "r1", facade=receiver_facade, concurrency=4, handler="sleep", handler_ms=10,
        queue_settings=SMALL,
    )  # fmt: skip
    load = nodes.sender(
        "load", facade=sender_facade, concurrency=2, think_ms=50, duration_s=60,
        call_deadline_s=10,
    )  # fmt: skip
    load.wait_for("end", count=10)

    # When callers with no timeout of their own ask for answers 5,000 bytes long
    big = nodes.sender(
        "big",
        facade=sender_facade,
        call_style=call_style,
        count=BIG,
        concurrency=BIG,
        params={"answer_pad": ANSWER_PAD},
        call_deadline_s=10,
        # (so that, were the calls left waiting, the sender stops and the checker judges them)
        duration_s=20,
        drain_timeout_s=5,
    )
    assert big.wait(40) == 0, big.log_tail()
    # (and the load goes on a while after them)
    load.wait_for("end", count=len(ends(load)) + 10)
    assert load.stop() == 0
    wait_until(lambda: not held_by(fault_client, fault_prefix, "r1"), 10, 0.02, "r1 holds none")
    assert receiver.stop() == 0

    # Then each got a RemoteError saying its answer was too large, promptly, not retryable;
    # and every other call succeeded
    result = check_nodes(nodes.nodes, name="S17", redis_client=fault_client, prefix=fault_prefix)
    print(result.report())
    too_large = [call for call in result.calls if call.node == "big"]
    others = [call for call in result.calls if call.node != "big"]
    slowest = max((call.latency_ms or 0.0) / 1000.0 for call in too_large)
    figures(
        "S17",
        facades=f"{receiver_facade}/{sender_facade}",
        call_style=call_style,
        too_large=[call.message[:40] for call in too_large],
        slowest_s=slowest,
        bound_s=PROMPT_S,
        other_calls=len(others),
    )
    assert len(too_large) == BIG
    assert all(call.outcome == "RemoteError" for call in too_large)
    assert all(call.message.startswith("ResponseTooLarge: ") for call in too_large)
    assert all(call.retryable is False for call in too_large)
    assert slowest <= PROMPT_S
    assert all(call.ok for call in others)
    result.assert_clean(min_calls=BIG + 20, max_false_maybe_executed=0, max_false_data_loss=0)
