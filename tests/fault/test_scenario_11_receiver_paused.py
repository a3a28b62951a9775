"""Scenario 11: a receiver process frozen (SIGSTOP) while it holds requests, then thawed.

- Frozen 2x its timeout: every caller gets exactly one outcome (ReceiverLost; by `call`, or by
  `send`'s one on_failure when the receiver is the sync one); the zombie wakes,
  its handlers finish and answer, and those responses are NOT applied: Redis keeps each request
  cancelled as receiver_lost with no response, and the receiver logs each one as dropped.
  Afterwards it serves new calls normally.
- Frozen 0.5x its timeout: no false death; the calls finish ok once the handlers return."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import redis

from tests.fault.checker import check_nodes
from tests.fault.nodes import NodeFactory
from tests.fault.scenarios import (
    RECEIVER_TIMEOUT_S,
    data_loss_declared,
    ends,
    events,
    figures,
    hold_fault,
    request_hash,
)
from tests.redis_servers import server_ms, wait_until

pytestmark = pytest.mark.fault

#: Requests held by the receiver when it freezes.
HELD = 4


@pytest.mark.parametrize("facade", ["async", "sync"])
@pytest.mark.timeout(90)
def test_receiver_frozen_twice_its_timeout_cannot_apply_its_responses(
    nodes: NodeFactory, fault_client: redis.Redis, fault_prefix: str, facade: str
) -> None:
    freeze_s = 2 * RECEIVER_TIMEOUT_S
    # Given a receiver holding HELD requests in handlers that wait on a barrier
    receiver = nodes.receiver("r1", facade=facade, handler="barrier", concurrency=HELD)
    # (with the sync receiver, the callers `send` and wait for the one callback)
    style = "send" if facade == "sync" else "call"
    sender = nodes.sender("s1", count=HELD, concurrency=HELD, call_deadline_s=30, call_style=style)
    ids = {record["id"] for record in receiver.wait_for("start", count=HELD)}

    # When the receiver is frozen for 2x its timeout (its handlers may return the moment it
    # thaws: the barrier is opened while it is frozen)
    receiver.pause()
    paused_at = time.monotonic()
    lost = sender.wait_for("end", count=HELD, timeout_s=freeze_s)
    Path(receiver.config.barrier_path).touch()
    hold_fault(paused_at + freeze_s - time.monotonic())
    receiver.resume()
    resumed_at = time.monotonic()

    # Then each caller got one outcome, ReceiverLost, while the receiver was frozen
    assert sender.wait(10) == 0
    assert sorted(r["id"] for r in lost) == sorted(ids)
    assert [r["outcome"] for r in ends(sender)] == ["ReceiverLost"] * HELD
    # And the zombie's handlers finish and answer, but every response is dropped
    receiver.wait_for("end", count=HELD, timeout_s=10)
    dropped = re.compile(r"response dropped request_id=(\w+) outcome=(\w+)")
    wait_until(
        lambda: len(dropped.findall(receiver.log_tail(200))) >= HELD, 10, 0.01, "drops logged"
    )
    drops = dict(dropped.findall(receiver.log_tail(200)))
    states = {rid: request_hash(fault_client, fault_prefix, rid) for rid in ids}
    zombie_cancels = [r.get("reason") for r in events(receiver, "cancelled")]
    figures(
        "S11-2x",
        facade=facade,
        style=style,
        frozen_s=resumed_at - paused_at,
        lost_after_freeze_s=[round(r["t_mono"] - paused_at, 3) for r in lost],
        drops=sorted(set(drops.values())),
        zombie_saw_cancel=zombie_cancels,
        redis_states=sorted({f"{f.get('st')}/{f.get('why')}" for f in states.values()}),
        data_loss_declared=len(data_loss_declared(receiver)),
    )
    assert set(drops) == ids and set(drops.values()) <= {"stale", "fenced"}
    for fields in states.values():
        assert (fields.get("st"), fields.get("why")) == ("cancelled", "receiver_lost"), fields
        assert "rsp" not in fields
    # And the thawed receiver serves new callers normally
    again = nodes.sender("s2", count=HELD, concurrency=HELD, call_deadline_s=15)
    assert again.wait(20) == 0
    assert [r["outcome"] for r in ends(again)] == ["ok"] * HELD
    result = check_nodes(nodes.nodes, name="S11-2x", redis_client=fault_client, prefix=fault_prefix)
    print(result.report())
    result.assert_clean(min_calls=2 * HELD)
    # (the frozen node notices its own silence and starts a fresh canary: Redis lost nothing)
    assert data_loss_declared(receiver) == []


@pytest.mark.timeout(60)
def test_receiver_frozen_half_its_timeout_is_not_declared_dead(
    nodes: NodeFactory, fault_client: redis.Redis, fault_prefix: str
) -> None:
    freeze_s = 0.5 * RECEIVER_TIMEOUT_S
    # Given a receiver holding HELD requests in handlers that wait on a barrier
    receiver = nodes.receiver("r1", handler="barrier", concurrency=HELD)
    sender = nodes.sender("s1", count=HELD, concurrency=HELD, call_deadline_s=30)
    ids = {record["id"] for record in receiver.wait_for("start", count=HELD)}

    # When the receiver is frozen for half its timeout, then thaws
    receiver.pause()
    paused_at = time.monotonic()
    hold_fault(freeze_s)
    thawed_ms = server_ms(fault_client)
    receiver.resume()
    resumed_at = time.monotonic()
    # (and has beaten again for every request, so the freeze is fully behind it)
    wait_until(
        lambda: all(
            int(request_hash(fault_client, fault_prefix, rid).get("hr", 0)) > thawed_ms
            for rid in ids
        ),
        5,
        0.01,
        "beats after the thaw",
    )
    beaten_at = time.monotonic()
    Path(receiver.config.barrier_path).touch()

    # Then no request was declared dead: every call ends ok, nothing was cancelled
    assert sender.wait(15) == 0
    result = check_nodes(
        nodes.nodes, name="S11-half", redis_client=fault_client, prefix=fault_prefix
    )
    print(result.report())
    figures(
        "S11-half",
        frozen_s=resumed_at - paused_at,
        first_beats_after_thaw_s=beaten_at - resumed_at,
        outcomes=dict(result.outcomes),
        cancellations_seen=len(events(receiver, "cancelled")),
        data_loss_declared=len(data_loss_declared(receiver)),
    )
    result.assert_clean(min_calls=HELD, min_success_rate=1.0)
    assert [r["outcome"] for r in ends(sender)] == ["ok"] * HELD
    assert events(receiver, "cancelled") == []
    assert data_loss_declared(receiver) == []
