"""Scenario 15 (issue 15, item 1): a long-running node pair through an idle endpoint's expiry. A
sender and a receiver use two endpoints, a busy one and one that goes idle. A node keeps, per
endpoint it touched, the highest sequence number it read, to notice Redis going back in time; an
endpoint nobody enqueues on lets its sequence numbers expire after the list TTL (3 s here, 1 day in
production), and that is no data loss: they start again at the server's clock, above. The timings
keep production's order: a data-loss check (1 s) well inside half a list TTL, and a receiver's take
waiting (1 s here, 30 s in production) well inside a list TTL.

First the idle endpoint sits for two list TTLs with nobody calling it while the receiver still
serves it (its numbers expire meanwhile: nothing refreshes them but enqueues); then the receiver
stops serving it too, and three more data-loss checks pass; then it is used again. Throughout,
no node declares data loss, and every call, on the busy endpoint all along and on the idle one
after it comes back, succeeds.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from prq.core.keys import KeySchema
from tests.fault.checker import check_nodes
from tests.fault.node_main import switch_path
from tests.fault.nodes import NodeFactory, NodeProcess
from tests.fault.scenarios import (
    CHECK_S,
    data_loss_declared,
    events,
    figures,
    hold_fault,
)
from tests.redis_servers import wait_until

pytestmark = pytest.mark.fault

BUSY, IDLE = "poll://busy", "poll://idle"
#: The shrunk list TTL: an enqueue counter nobody refreshes expires this long after its last
#: refresh.
LIST_TTL_S = 3.0
#: Every node's settings: the list TTL, and a take that waits at most a poll interval.
SHORT_LIVED = {"list_ttl_s": LIST_TTL_S, "dequeue_timeout_s": 1.0}
#: Calls ok on an endpoint before (and after) its idle time.
WARM_OK = 10


def _ok_on(sender: NodeProcess, endpoint: str, since: float = 0.0) -> int:
    """Calls of `sender` to `endpoint`, started at `since` or later, that ended ok."""
    started = {r["id"]: r for r in events(sender, "start") if r["t_mono"] >= since}
    return sum(
        r["outcome"] == "ok" and started.get(r["id"], {}).get("endpoint") == endpoint
        for r in events(sender, "end")
    )


@pytest.mark.parametrize(
    ("receiver_facade", "sender_facade"), [("async", "sync"), ("sync", "async")]
)
@pytest.mark.timeout(90)
def test_an_endpoint_left_idle_past_its_list_ttl_is_no_data_loss(
    nodes: NodeFactory,
    fault_client: redis.Redis,
    fault_prefix: str,
    fault_dir: Path,
    receiver_facade: str,
    sender_facade: str,
) -> None:
    # Given a receiver serving both endpoints and a sender calling them in turn, TTLs shrunk
    switches = fault_dir / "switches"
    switches.mkdir()
    both = {
        "endpoint": BUSY,
        "extra_endpoints": [IDLE],
        "switch_dir": str(switches),
        "queue_settings": SHORT_LIVED,
    }
    receiver = nodes.receiver(
        "r1", facade=receiver_facade, concurrency=2, handler="sleep", handler_ms=10, **both
    )
    sender = nodes.sender(
        "s1",
        facade=sender_facade,
        concurrency=2,
        think_ms=50,
        duration_s=70,
        call_deadline_s=20,
        **both,
    )
    wait_until(lambda: min(_ok_on(sender, BUSY), _ok_on(sender, IDLE)) >= WARM_OK, 30, 0.05, "warm")
    counter = KeySchema(fault_prefix).endpoint(IDLE).numbers
    assert fault_client.exists(counter)

    # When nobody calls the idle endpoint for two list TTLs (the receiver still serving it)
    switch_path(switches, "calls-off", IDLE).touch()
    idle_from = time.monotonic()
    hold_fault(2 * LIST_TTL_S)
    lived_on = bool(fault_client.exists(counter))
    # And then the receiver stops serving it too, until its counter has expired
    switch_path(switches, "serve-off", IDLE).touch()
    wait_until(lambda: not fault_client.exists(counter), 4 * LIST_TTL_S + 10, 0.02, "expired")
    expired_at = time.monotonic()
    # (and three more data-loss checks pass)
    hold_fault(3 * CHECK_S)
    busy_ok_while_idle = _ok_on(sender, BUSY, idle_from)

    # And the endpoint is used again
    switch_path(switches, "serve-off", IDLE).unlink()
    switch_path(switches, "calls-off", IDLE).unlink()
    back_at = time.monotonic()
    wait_until(lambda: _ok_on(sender, IDLE, back_at) >= WARM_OK, 20, 0.05, "idle endpoint back")
    assert sender.stop() == 0
    assert receiver.stop() == 0

    # Then no node declared data loss, and every call succeeded, on both endpoints
    result = check_nodes(nodes.nodes, name="S15", redis_client=fault_client, prefix=fault_prefix)
    print(result.report())
    figures(
        "S15",
        facades=f"{receiver_facade}/{sender_facade}",
        numbers_lived_on_while_served=lived_on,
        idle_s=expired_at - idle_from,
        busy_ok_while_idle=busy_ok_while_idle,
        idle_ok_after=_ok_on(sender, IDLE, back_at),
        data_loss_declared=sum(len(data_loss_declared(node)) for node in nodes.nodes),
    )
    result.assert_clean(min_calls=100, max_false_maybe_executed=0, max_false_data_loss=0)
    assert not any(data_loss_declared(node) for node in nodes.nodes)
    assert dict(result.outcomes) == {"ok": len(result.calls)}
    assert busy_ok_while_idle >= 2 * WARM_OK
    assert not lived_on  # (they expired while served, and no node took that for a loss)
