"""Scenario 7: every node's connections to Redis are reset (RST) every 2-5 s while calls run: no
call fails, nothing runs twice, no result reaches the wrong caller. Two of the senders `send`
instead of `call`: each send gets exactly one callback.

Resets go on for the issue's 60 s, every 2-5 s, so a run sees 12-30 resets of every link,
each hitting calls in all their phases (enqueue, take, response, poll, pub/sub)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest
import redis

from tests.fault.checker import check_nodes
from tests.fault.nodes import NodeFactory
from tests.fault.proxy import FaultProxy
from tests.fault.scenarios import data_loss_declared, events, figures, hold_fault
from tests.redis_servers import wait_until

pytestmark = pytest.mark.fault

#: How long the resets go on (the issue's 60 s).
RESETS_FOR_S = 60.0
#: Pause between two resets: uniform in this range, seconds (the issue's 2-5 s).
RESET_EVERY_S = (2.0, 5.0)
#: Handler time, ms.
SERVICE_MS = 10.0


@pytest.mark.timeout(180)
def test_connection_resets_every_few_seconds(
    nodes: NodeFactory,
    make_proxy: Callable[..., FaultProxy],
    fault_client: redis.Redis,
    fault_prefix: str,
) -> None:
    # Given two receivers and two senders (one of each per facade), every one on its own link
    links: list[FaultProxy] = []

    def link() -> str:
        links.append(make_proxy())
        return links[-1].url

    for name, facade, slots in (("r1", "async", 16), ("r2", "sync", 16)):
        nodes.receiver(
            name,
            facade=facade,
            concurrency=slots,
            handler="sleep",
            handler_ms=SERVICE_MS,
            redis_url=link(),
        )
    # (and two more whose callers `send` and wait for the one callback)
    senders = [
        nodes.sender(
            name,
            facade=facade,
            call_style=style,
            concurrency=callers,
            duration_s=RESETS_FOR_S + 60,
            call_deadline_s=30.0,
            redis_url=link(),
        )
        for name, facade, style, callers in (
            ("s1", "async", "call", 16),
            ("s2", "sync", "call", 8),
            ("s3", "async", "send", 4),
            ("s4", "sync", "send", 4),
        )
    ]
    wait_until(lambda: all(events(s, "end") for s in senders), 20, 0.05, "calls flowing")

    # When every link is reset every 2-5 s for RESETS_FOR_S
    rng = random.Random()
    started = time.monotonic()
    resets = 0
    while True:
        pause = rng.uniform(*RESET_EVERY_S)
        if time.monotonic() + pause > started + RESETS_FOR_S:
            break
        hold_fault(pause)
        resets += sum(proxy.reset_connections() for proxy in links)
    ended_at = time.monotonic()
    for sender in senders:
        assert sender.stop() == 0, sender.log_tail()
    for receiver in nodes.receivers:
        assert receiver.stop() == 0, receiver.log_tail()

    # Then no call failed, nothing ran twice, no cross-talk, and every key has a TTL
    result = check_nodes(nodes.nodes, name="S07", redis_client=fault_client, prefix=fault_prefix)
    print(result.report())
    during = [c for c in result.calls if started <= c.start < ended_at]
    declared = [line for node in nodes.nodes for line in data_loss_declared(node)]
    figures(
        "S07",
        resets_for_s=ended_at - started,
        connections_reset=resets,
        reset_rounds=f"{RESET_EVERY_S[0]:g}-{RESET_EVERY_S[1]:g}s",
        calls_during=len(during),
        failed=sum(1 for c in result.finished_calls if not c.ok),
        p99_ms=f"{result.latency_ms(0.99):.1f}",
        max_ms=f"{result.latency_ms(1.0):.1f}",
        false_data_loss_declarations=len(declared),
    )
    assert resets > 0 and len(during) > 100
    result.assert_clean(min_calls=100, min_success_rate=1.0)
    assert result.success_rate() == 1.0
    assert declared == []  # (Redis lost nothing)
