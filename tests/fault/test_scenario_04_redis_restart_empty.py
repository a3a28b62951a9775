"""Scenario 4: Redis killed (-9) and restarted EMPTY mid-load, 64 callers. No caller hangs, no
request runs twice, none runs after its caller was told it did not; the loss is detected within
the restart delay + the data-loss check interval + 1 s of the kill; and within 5 s of the
restart at least 99% of calls succeed again. One sender's callers `send` and wait for the
callback: each gets exactly one."""

from __future__ import annotations

import pytest
import redis

from prq.embedded import EmbeddedRedis
from tests.fault.checker import check_nodes
from tests.fault.nodes import NodeFactory
from tests.fault.redis_faults import TtlAuditor, crash, restart_empty
from tests.fault.scenarios import CHECK_S, SLACK_S, events, figures, hold_fault
from tests.redis_servers import wait_until

pytestmark = pytest.mark.fault

#: Callers: 2 sender processes x 32 (the issue's 64).
SENDERS, CALLERS = 2, 32
#: How the senders' callers call, in turn: `call`, or `send` and its callback.
STYLES = ("send", "call")
#: How long Redis stays down before it is started again (empty).
DOWN_S = 1.0
#: Calls that must have succeeded before the crash (the load is steady).
WARM_OK = 200
#: Within this long of the restart the success rate must be back to >= 99%.
RECOVERY_S = 5.0
#: Calls started after the recovery window that the success rate is judged on (at least).
MIN_CALLS_AFTER = 200
#: Handler time of the service, ms (so requests are in flight, held, when Redis dies); the
#: second receiver's is longer than the outage.
SERVICE_MS, LONG_SERVICE_MS = 50.0, 4000.0


@pytest.mark.timeout(120)
def test_redis_killed_and_restarted_empty_mid_load(
    nodes: NodeFactory,
    fault_redis: EmbeddedRedis,
    fault_client: redis.Redis,
    fault_prefix: str,
) -> None:
    # Given two receivers (one per facade; the second one's handler outlasts the outage, so it
    # holds requests when the loss is noticed) and 64 callers under steady load
    receivers = [
        nodes.receiver(f"r{n}", facade=facade, concurrency=32, handler="sleep", handler_ms=ms)
        for n, facade, ms in ((1, "async", SERVICE_MS), (2, "sync", LONG_SERVICE_MS))
    ]
    # (half of them `call`, half `send` and wait for the callback)
    senders = [
        nodes.sender(
            f"s{n}",
            concurrency=CALLERS,
            duration_s=60.0,
            call_deadline_s=20.0,
            call_style=STYLES[n % len(STYLES)],
        )
        for n in range(1, SENDERS + 1)
    ]
    wait_until(
        lambda: sum(r["outcome"] == "ok" for s in senders for r in events(s, "end")) >= WARM_OK,
        30,
        0.05,
        f"{WARM_OK} calls ok before the crash",
    )

    with TtlAuditor(fault_redis, fault_prefix) as auditor:
        # When Redis is killed with SIGKILL and, DOWN_S later, started again empty
        killed_at = crash(fault_redis)
        hold_fault(DOWN_S)
        up_at = restart_empty(fault_redis)

        # And the load goes on until enough calls started after the recovery window ended
        def calls_after_recovery() -> int:
            since = up_at + RECOVERY_S
            return sum(
                r["outcome"] == "ok" and r["t_mono"] >= since
                for s in senders
                for r in events(s, "end")
            )

        wait_until(
            lambda: calls_after_recovery() >= MIN_CALLS_AFTER,
            RECOVERY_S + 30,
            0.1,
            f"{MIN_CALLS_AFTER} calls after the recovery window",
        )
        for sender in senders:
            assert sender.stop() == 0
        for receiver in receivers:
            assert receiver.stop() == 0

    # Then: hung 0, duplicates 0, ghosts 0, every key with a TTL
    result = check_nodes(nodes.nodes, name="S04", redis_client=fault_client, prefix=fault_prefix)
    print(result.report())
    data_loss_cancels = [
        r["t_mono"]
        for rcv in receivers
        for r in events(rcv, "cancelled")
        if r.get("reason") == "data_loss"
    ]
    first_data_loss = result.first_end("DataLoss")
    detections = [t for t in (first_data_loss, *data_loss_cancels) if t is not None]
    detected_at = min(detections) if detections else None
    restart_delay = up_at - killed_at
    after = result.success_rate(since=up_at + RECOVERY_S)
    window = [c for c in result.finished_calls if c.start >= up_at + RECOVERY_S]
    figures(
        "S04",
        callers=SENDERS * CALLERS,
        restart_delay_s=restart_delay,
        first_DataLoss_after_kill_s=None
        if first_data_loss is None
        else first_data_loss - killed_at,
        first_data_loss_cancel_after_kill_s=min(data_loss_cancels) - killed_at
        if data_loss_cancels
        else None,
        detection_bound_s=restart_delay + CHECK_S + SLACK_S,
        success_first_5s_after_restart=f"{result.success_rate(up_at, up_at + RECOVERY_S):.4f}",
        success_from_restart_plus_5s=f"{after:.4f}",
        calls_judged=len(window),
        ttl_samples=auditor.samples,
        keys_seen_without_ttl=len(auditor.no_ttl),
    )
    result.assert_clean(min_calls=WARM_OK)
    assert auditor.no_ttl == set()
    # And the loss was detected within the restart delay + check interval + 1 s of the kill
    assert detected_at is not None, "Redis lost every key, yet no node declared data loss"
    assert detected_at - killed_at <= restart_delay + CHECK_S + SLACK_S
    # And within 5 s of the restart >= 99% of calls succeed again
    assert len(window) >= MIN_CALLS_AFTER
    assert after >= 0.99
