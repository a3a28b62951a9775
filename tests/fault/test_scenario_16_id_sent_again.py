"""Scenario 16 (issue 15, item 2): request ids sent again after their records expired, to a
long-lived receiver. Deterministic ids are how Spark jobs are re-run, and a dead-letter replay
resets the attempt, so a receiver meets ids it ran before: once the record of the first run is
gone (its response TTL passed), the same id is a new request that runs and answers, never a sign
of Redis going back in time.

The ids are sent again either once their records expired, or once the endpoint also sat unserved
until its sequence numbers expired (they start again at the server's clock: above the first
run's, never the same numbers again).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from prq.core.keys import KeySchema
from tests.fault.checker import check_nodes
from tests.fault.node_main import switch_path
from tests.fault.nodes import NodeFactory
from tests.fault.scenarios import ENDPOINT, data_loss_declared, figures
from tests.redis_servers import wait_until

pytestmark = pytest.mark.fault

#: Shrunk TTLs: an answered request is kept 1.5 s, an unused enqueue counter 3 s (a take waits
#: at most 1 s, well inside it, as 30 s is inside a day in production).
SHORT_LIVED = {"response_ttl_s": 1.5, "list_ttl_s": 3.0, "dequeue_timeout_s": 1.0}
#: The ids, sent twice.
IDS = [f"job-{n}" for n in range(1, 5)]


@pytest.mark.parametrize(
    ("receiver_facade", "sender_facade", "delivery", "expired"),
    [
        ("async", "sync", "at_most_once", "record"),
        ("sync", "async", "at_least_once", "record"),
        ("async", "async", "at_least_once", "counter"),
        ("sync", "sync", "at_most_once", "counter"),
    ],
)
@pytest.mark.timeout(90)
def test_an_id_sent_again_after_its_record_expired_runs_again(
    nodes: NodeFactory,
    fault_client: redis.Redis,
    fault_prefix: str,
    fault_dir: Path,
    receiver_facade: str,
    sender_facade: str,
    delivery: str,
    expired: str,
) -> None:
    # Given a long-lived receiver that ran and answered calls with known ids
    switch_dir = fault_dir / "switches"
    switch_dir.mkdir()
    common = {"switch_dir": str(switch_dir), "queue_settings": SHORT_LIVED}
    receiver = nodes.receiver("r1", facade=receiver_facade, concurrency=2, **common)
    calls = {
        "count": len(IDS),
        "request_ids": IDS,
        "facade": sender_facade,
        "delivery": delivery,
        "concurrency": 2,
        "call_deadline_s": 10,
        **common,
    }
    assert nodes.sender("first", **calls).wait(30) == 0
    keys = KeySchema(fault_prefix).endpoint(ENDPOINT)
    first_numbers = int(fault_client.get(keys.numbers) or 0)

    # When their records expired (and, in the counter case, the endpoint's counter too, while
    # nobody served it)
    gone = [keys.request(request_id) for request_id in IDS]
    if expired == "counter":
        switch_path(switch_dir, "serve-off", ENDPOINT).touch()
        gone.append(keys.numbers)
    wait_until(lambda: not fault_client.exists(*gone), 20, 0.02, f"{expired} expired")
    switch_path(switch_dir, "serve-off", ENDPOINT).unlink(missing_ok=True)
    # And the same ids are sent again
    assert nodes.sender("again", **calls).wait(30) == 0
    counter = int(fault_client.get(keys.numbers) or 0)
    assert receiver.stop() == 0

    # Then each ran again, as a new request, and answered its own caller; no node declared
    # data loss
    result = check_nodes(nodes.nodes, name="S16", redis_client=fault_client, prefix=fault_prefix)
    print(result.report())
    figures(
        "S16",
        facades=f"{receiver_facade}/{sender_facade}",
        delivery=delivery,
        expired=expired,
        numbers_after=counter - first_numbers,
        runs=[call.runs for call in result.calls],
    )
    result.assert_clean(min_calls=2 * len(IDS), max_false_maybe_executed=0, max_false_data_loss=0)
    assert dict(result.outcomes) == {"ok": 2 * len(IDS)}
    assert [call.runs for call in result.calls] == [1] * 2 * len(IDS)
    assert not any(data_loss_declared(node) for node in nodes.nodes)
    # (and the ids came back with sequence numbers above those of their first run, also once
    # the endpoint's numbers had expired)
    assert counter > first_numbers > 0
