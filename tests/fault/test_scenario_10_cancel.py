"""Scenario 10: cancellation across processes. The caller, the receiver and the canceller are
three OS processes: sender and receiver are node processes, the canceller is this test's own
node (a `prq.Queue` straight to Redis) that knows nothing but the request id.

- A cancel after pickup reaches the receiver within poll interval + 1 s, by pub/sub or, with
  every pub/sub message to the receiver dropped, by its polled marker; the caller gets
  CancelledAfterPickup (as `call`'s error, or `send`'s one on_failure) and the handler's late
  response is dropped.
- 500 calls, >= 100 of them cancelled while a receiver process dequeues: nothing raises
  unexpectedly, nothing runs after its caller was told it never would, and no key leaks (every
  key has a TTL throughout, and none outlives the traffic by more than the longest TTL).
- 1,000 cancels racing the responses of a receiver process: exactly one outcome each, and the
  same one for the caller, the canceller and Redis.

The in-process versions of the last two are tests/integration/test_cancel_races.py; these add
the process boundary (and the node that cancels knows neither caller nor receiver)."""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis

from prq import Queue
from prq.embedded import EmbeddedRedis
from tests.fault.checker import CheckResult, check_nodes
from tests.fault.nodes import NodeFactory, NodeProcess
from tests.fault.proxy import FaultProxy
from tests.fault.redis_faults import TtlAuditor
from tests.fault.scenarios import (
    POLL_S,
    SLACK_S,
    JsonlTail,
    ends,
    events,
    figures,
    hold_fault,
    request_hash,
)
from tests.fault.timings import fault_redis_settings, fault_settings
from tests.redis_servers import request_keys, wait_until

pytestmark = pytest.mark.fault

#: Outcomes a cancelled call may end with.
CANCELLED = ("CancelledBeforePickup", "CancelledAfterPickup")
#: Threads the canceller node sends its cancels from.
CANCEL_THREADS = 16
#: In the race, each cancel is sent a random 0 to this many seconds after its handler started,
#: so that it lands before, during or after the response (which takes a few ms).
RACE_SPREAD_S = 0.01
#: Short TTLs for the 500-call wave, so that "no key leaks" is a bound of seconds.
SHORT_TTLS: dict[str, float] = {
    "pickup_timeout_s": 4.0,
    "request_ttl_extra_s": 1.0,
    "response_ttl_s": 1.0,
    "cancel_marker_ttl_s": 1.0,
    "list_ttl_s": 2.0,
    # (below half the list TTL, as settings require)
    "data_loss_check_interval_s": 0.5,
}


@contextlib.contextmanager
def _canceller_node(url: str, prefix: str, **overrides: float) -> Iterator[Queue]:
    queue = Queue(
        fault_redis_settings(url),
        prefix=prefix,
        settings=fault_settings(**overrides),
        node_id="canceller",
    )
    queue.start()
    try:
        yield queue
    finally:
        queue.close()


@pytest.fixture
def canceller(fault_redis: EmbeddedRedis, fault_prefix: str) -> Iterator[Queue]:
    """The node that cancels: this test process, straight to Redis."""
    with _canceller_node(fault_redis.url, fault_prefix) as queue:
        yield queue


def _cancel_while(
    canceller: Queue,
    source: NodeProcess,
    path_of: Callable[[NodeProcess], Path],
    pick: Callable[[int, dict[str, Any]], bool],
    until: Callable[[], bool],
    timeout_s: float,
    spread_s: float = 0.0,
) -> dict[str, bool]:
    """Cancel, from CANCEL_THREADS threads, every request whose `start` record in `source`'s
    file `pick` selects (record number, record), as soon as it appears (or a random 0 to
    `spread_s` later: when in its life the cancel lands); until `until()`."""
    rng = random.Random()

    def cancel(request_id: str, delay_s: float) -> bool:
        hold_fault(delay_s)
        return canceller.cancel(request_id)

    tail = JsonlTail(path_of(source))
    futures: dict[str, Future[bool]] = {}
    seen = 0
    deadline = time.monotonic() + timeout_s
    with ThreadPoolExecutor(CANCEL_THREADS, thread_name_prefix="cancel") as pool:
        while True:
            done = until()  # read before the tail, so the last records are not missed
            for record in tail.read():
                if record.get("event") != "start":
                    continue
                if pick(seen, record):
                    delay_s = rng.uniform(0.0, spread_s)
                    futures[record["id"]] = pool.submit(cancel, record["id"], delay_s)
                seen += 1
            if done:
                break
            assert time.monotonic() < deadline, f"{source.name} did not finish in {timeout_s} s"
            time.sleep(0.002)  # the tail's poll interval, not a synchronisation
        return {request_id: future.result(30) for request_id, future in futures.items()}


@pytest.mark.parametrize(
    ("path", "style"), [("pubsub", "call"), ("polled", "call"), ("pubsub", "send")]
)
def test_cancel_after_pickup_from_another_node(
    nodes: NodeFactory,
    make_proxy: Callable[..., FaultProxy],
    fault_client: redis.Redis,
    fault_prefix: str,
    canceller: Queue,
    path: str,
    style: str,
) -> None:
    # Given a call picked up by a receiver whose handler waits (until released or cancelled);
    # in the "polled" case no pub/sub message reaches the receiver
    link = make_proxy()
    if path == "polled":
        link.drop_pubsub_messages(True)
    receiver = nodes.receiver("r1", handler="barrier", redis_url=link.url)
    sender = nodes.sender("s1", count=1, call_deadline_s=20, call_style=style)
    request_id = receiver.wait_for("start")[0]["id"]

    # When a third node, knowing only the id, cancels it
    cancelled_at = time.monotonic()
    assert canceller.cancel(request_id) is True

    # Then the receiver is signalled within poll interval + 1 s
    [signal] = receiver.wait_for("cancelled", timeout_s=POLL_S + SLACK_S + 5)
    # And the caller gets CancelledAfterPickup
    assert sender.wait(15) == 0
    [end] = ends(sender)
    # And the handler's response, given after the cancel, is dropped
    receiver.wait_for("end")
    wait_until(lambda: "outcome=stale" in receiver.log_tail(), 10, 0.01, "response dropped")
    fields = request_hash(fault_client, fault_prefix, request_id)
    figures(
        "S10-signal",
        path=path,
        style=style,
        receiver_signalled_after_s=signal["t_mono"] - cancelled_at,
        bound_s=POLL_S + SLACK_S,
        caller_outcome=end["outcome"],
        caller_told_after_s=end["t_mono"] - cancelled_at,
        pubsub_dropped=link.dropped_frames,
        redis_state=f"{fields.get('st')}/{fields.get('why')}",
    )
    assert signal["reason"] == "cancelled"
    assert signal["t_mono"] - cancelled_at <= POLL_S + SLACK_S
    assert end["outcome"] == "CancelledAfterPickup"
    assert end["via"] == ("on_failure" if style == "send" else "call")
    assert (fields.get("st"), fields.get("why")) == ("cancelled", "cancelled")
    assert "rsp" not in fields
    result = check_nodes(
        nodes.nodes, name="S10-signal", redis_client=fault_client, prefix=fault_prefix
    )
    print(result.report())
    result.assert_clean()


def _agrees(result: CheckResult, cancels: dict[str, bool]) -> list[str]:
    """Calls whose outcome disagrees with what their cancel returned (True: this cancel won)."""
    wrong = []
    for call in result.calls:
        won = cancels.get(call.id)
        if won is True and call.outcome not in CANCELLED:
            wrong.append(f"{call.id}: cancel won, outcome {call.outcome}")
        if won is not True and call.outcome != "ok":
            wrong.append(f"{call.id}: cancel {won}, outcome {call.outcome}")
    return wrong


@pytest.mark.timeout(90)
def test_500_calls_cancelled_while_dequeuing_runs(
    nodes: NodeFactory,
    fault_redis: EmbeddedRedis,
    fault_client: redis.Redis,
    fault_prefix: str,
) -> None:
    calls, every = 500, 4
    settings = fault_settings(**SHORT_TTLS)
    # Given a receiver process serving an endpoint, and a sender process making 500 calls
    with (
        TtlAuditor(fault_redis, fault_prefix, interval_s=0.5) as auditor,
        _canceller_node(fault_redis.url, fault_prefix, **SHORT_TTLS) as canceller,
    ):
        nodes.receiver(
            "r1",
            facade="sync",
            concurrency=8,
            handler="sleep",
            handler_ms=20,
            queue_settings=SHORT_TTLS,
        )
        sender = nodes.sender(
            "s1", concurrency=16, count=calls, call_deadline_s=30, queue_settings=SHORT_TTLS
        )

        # When every 4th call is cancelled (by the third node) as soon as it is sent
        cancels = _cancel_while(
            canceller,
            sender,
            lambda node: node.history_path,
            lambda n, _record: n % every == 0,
            lambda: not sender.alive,
            60,
        )
        assert sender.returncode == 0
        for receiver in nodes.receivers:
            assert receiver.stop() == 0

    # Then nothing raised unexpectedly and nothing ran after its caller was told it never would
    result = check_nodes(
        nodes.nodes, name="S10-wave", redis_client=fault_client, prefix=fault_prefix
    )
    print(result.report())
    unexpected = {k: v for k, v in result.outcomes.items() if k not in ("ok", *CANCELLED)}
    cancelled = sum(result.outcomes[name] for name in CANCELLED)
    # And no key leaks: every key had a TTL at every sample, and no request key outlives the
    # traffic by more than the longest TTL a key can get (the id locator's, or a take receipt's)
    longest_ttl_s = max(
        settings.request_ttl_s(settings.pickup_timeout_s)
        + settings.in_flight_ttl_s()
        + settings.response_ttl_s,
        settings.receipt_ttl_s(fault_redis_settings(fault_redis.url)),
    )
    ttl_ms = {key: fault_client.pttl(key) for key in request_keys(fault_client, fault_prefix)}
    ttl_ms = {key: ms for key, ms in ttl_ms.items() if ms != -2}  # (-2: expired meanwhile)
    figures(
        "S10-wave",
        calls=len(result.calls),
        cancels_sent=len(cancels),
        cancels_won=sum(cancels.values()),
        ended_cancelled=cancelled,
        before_pickup=result.outcomes["CancelledBeforePickup"],
        after_pickup=result.outcomes["CancelledAfterPickup"],
        unexpected=unexpected,
        ttl_samples=auditor.samples,
        keys_without_ttl=len(auditor.no_ttl),
        keys_left=len(ttl_ms),
        longest_ttl_left_s=max(ttl_ms.values(), default=0) / 1000.0,
        bound_s=longest_ttl_s,
    )
    result.assert_clean(min_calls=calls)
    assert unexpected == {}
    # (how many cancels win depends on how fast the canceller sees the sends: ~120 of 125 on
    # an idle host, 59 on a loaded one; the checks that matter are the agreement below, this
    # one only that cancels were tried, and won often enough to be judged)
    assert len(cancels) >= 100 and cancelled >= len(cancels) // 4
    assert _agrees(result, cancels) == []
    assert auditor.no_ttl == set()
    too_long = {key: ms for key, ms in ttl_ms.items() if not 0 <= ms <= longest_ttl_s * 1000}
    assert too_long == {}


@pytest.mark.timeout(90)
def test_1000_cancels_racing_responses(
    nodes: NodeFactory,
    fault_client: redis.Redis,
    fault_prefix: str,
    canceller: Queue,
) -> None:
    calls = 1000
    # Given a receiver process answering quickly, and a sender process making 1,000 calls
    receiver = nodes.receiver(
        "r1", concurrency=16, handler="sleep", handler_ms=2, honour_cancel=False
    )
    sender = nodes.sender("s1", concurrency=32, count=calls, call_deadline_s=30)

    # When each request is cancelled (by the third node) the moment its handler starts, so
    # that the cancel and the response race
    cancels = _cancel_while(
        canceller,
        receiver,
        lambda node: node.ledger_path,
        lambda _n, _record: True,
        lambda: not sender.alive,
        60,
        spread_s=RACE_SPREAD_S,
    )
    assert sender.returncode == 0

    # Then every call has exactly one outcome, and caller, canceller and Redis agree on it
    result = check_nodes(
        nodes.nodes, name="S10-race", redis_client=fault_client, prefix=fault_prefix
    )
    print(result.report())
    ends_per_call: dict[str, int] = {}
    for record in events(sender, "end"):
        ends_per_call[record["id"]] = ends_per_call.get(record["id"], 0) + 1
    disagree = _agrees(result, cancels)
    redis_disagree = []
    for call in result.calls:
        fields = request_hash(fault_client, fault_prefix, call.id)
        state = (fields.get("st"), "rsp" in fields)
        if state != (("done", True) if call.ok else ("cancelled", False)):
            redis_disagree.append(f"{call.id}: {call.outcome} but Redis {state}")
    figures(
        "S10-race",
        calls=len(result.calls),
        cancels=len(cancels),
        answered=result.outcomes["ok"],
        cancelled=result.outcomes["CancelledAfterPickup"],
        disagreements=len(disagree) + len(redis_disagree),
    )
    result.assert_clean(min_calls=calls)
    assert len(cancels) == calls
    assert sorted(set(ends_per_call.values())) == [1] and len(ends_per_call) == calls
    assert set(result.outcomes) <= {"ok", "CancelledAfterPickup"}
    assert result.outcomes["ok"] > 0 and result.outcomes["CancelledAfterPickup"] > 0, "no race"
    assert disagree == [] and redis_disagree == []
