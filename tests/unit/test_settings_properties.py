"""Every QueueSettings (with the RedisSettings beside it) that is accepted works; every one that
is refused is refused at once, with InvalidSettings.

Accepted: each side's first beat and every next one come within half of the shorter timeout
(the other side sees two beats per timeout); every TTL derived from the settings outlives what
it must (a take receipt a failed take, the serve loop's pause and the next take; a record its
pickup window; a silent receiver's record its caller's judgment; a canary the checks between;
an enqueue counter the node's next check); and building every call the settings go into (the
enqueue, take, answer, withdraw, beat, data-loss check and presence report; the Redis client's
options) raises nothing, every number in them within what the scripts hold exactly.

Refused: InvalidSettings when the settings are built, never another exception, never later; and
every non-finite, negative, too small or too large duration, and every unknown keyword, is
refused. Values are drawn from the whole float line (inf, nan, 0, negatives, huge), huge ints,
and text as the environment gives it; timeouts, heartbeats, list TTLs and check intervals also
near their relations' edges.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from prq import InvalidSettings, QueueSettings, RedisSettings, Request
from prq.core.bounds import MAX_COUNT, MAX_DURATION_S, MIN_DURATION_S
from prq.core.defaults import DATA_LOSS_CHECK_SHARE, SERVE_BACKOFF_MAX_S
from prq.core.keys import KeySchema
from prq.core.lifecycle import DeliveryInfo, PendingRequest
from prq.node.watch import NodeWatch
from prq.protocol.effects import Call, Exec
from prq.protocol.flows.call import _enqueue_calls
from prq.protocol.flows.cancel import withdraw_flow
from prq.protocol.flows.context import Context, to_ms
from prq.protocol.flows.receiver import respond_flow, take_flow
from prq.protocol.scripts.redelivery import Redelivery
from prq.protocol.signing import Signer
from prq.serve.pace import _backoff_s
from prq.transport.budgets import STEP_GRACE_S
from prq.transport.client_options import client_kwargs
from prq.transport.pulse_router import PulseRouter
from prq.transport.signals import ThreadSignal

#: The duration fields, and whether 0 is a value of theirs ("none": no wait, no retries, ...).
QUEUE_DURATIONS: dict[str, bool] = {
    "pickup_timeout_s": False,
    "dequeue_timeout_s": True,
    "poll_interval_s": False,
    "heartbeat_interval_s": False,
    "heartbeat_initial_delay_s": True,
    "receiver_timeout_s": False,
    "sender_timeout_s": False,
    "data_loss_check_interval_s": False,
    "handoff_confirm_s": False,
    "retry_budget_s": True,
    "response_ttl_s": False,
    "max_response_ttl_s": False,
    "request_ttl_extra_s": False,
    "list_ttl_s": False,
    "cancel_marker_ttl_s": False,
    "dead_letter_ttl_s": False,
    "shutdown_timeout_s": True,
    "signing_clock_skew_s": True,
}
#: The size and count fields, and the least and most each may be.
QUEUE_INTS: dict[str, tuple[int, int]] = {
    "inline_limit_bytes": (1, MAX_COUNT),
    "max_body_bytes": (1, MAX_COUNT),
    "pulse_inline_limit_bytes": (0, MAX_COUNT),
    "dead_letter_max": (1, MAX_COUNT),
    "max_attempts": (1, 1000),
}
REDIS_DURATIONS: dict[str, bool] = {"socket_timeout_s": False, "connect_timeout_s": False}
#: The largest integer the scripts hold exactly (Lua numbers are doubles).
EXACT_IN_LUA = 2**53
#: An accepted setting must not refuse later: a wait that threads and sockets take.
LONGEST_WAIT_S = threading.TIMEOUT_MAX

SPECIAL = st.sampled_from(
    [
        math.inf, -math.inf, math.nan, 0.0, -0.0, -1.0, -1e-9, 1e-12, 0.0009, MIN_DURATION_S,
        MAX_DURATION_S, MAX_DURATION_S * 1.001, 1e12, 1e300, 10**400, -(10**400),
        "inf", "-inf", "nan", "1e400", "-3", "0", "2.5", "soon", None, True,
    ]
)  # fmt: skip
SANE = st.floats(min_value=MIN_DURATION_S, max_value=1e6) | st.integers(1, 10**5)
ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True)
DURATION = st.one_of(*[SANE] * 8, SPECIAL, ANY_FLOAT)
INT = st.one_of(
    *[st.integers(1, 10**6)] * 4,
    st.integers(-10, 10**30),
    st.sampled_from([0, MAX_COUNT, MAX_COUNT + 1, 10**400, 1.5, math.inf]),
)
#: A share of a timeout or a list TTL, around the edges of what is accepted (1/2).
SHARE = st.one_of(st.sampled_from([0.0, 0.25, 0.4999, 0.5, 0.5001, 1.0]), st.floats(0, 1.5))


@st.composite
def queue_values(draw: st.DrawFn) -> dict[str, Any]:
    """Keyword arguments for QueueSettings: a few fields drawn anywhere, and some pairs put
    near the relations between them."""
    values: dict[str, Any] = {}
    for name in draw(st.sets(st.sampled_from(sorted(QUEUE_DURATIONS)), max_size=4)):
        values[name] = draw(DURATION)
    for name in draw(st.sets(st.sampled_from(sorted(QUEUE_INTS)), max_size=2)):
        values[name] = draw(INT)
    if draw(st.booleans()):
        receiver, sender = draw(SANE), draw(SANE)
        values |= {"receiver_timeout_s": receiver, "sender_timeout_s": sender}
        for name in draw(
            st.sets(st.just("heartbeat_interval_s") | st.just("heartbeat_initial_delay_s"))
        ):
            values[name] = min(receiver, sender) * draw(SHARE)
    if draw(st.booleans()):
        values["list_ttl_s"] = list_ttl = draw(SANE)
        if draw(st.booleans()):
            values["data_loss_check_interval_s"] = list_ttl * draw(SHARE)
    if draw(st.booleans()):
        values["signing_key"] = "k" * 32
    if draw(st.sampled_from([False] * 3 + [True])):
        values[draw(st.sampled_from(["pikup_timeout_s", "receiver_timeout", "ttl"]))] = 3
    return values


def redis_values() -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.sampled_from(sorted(REDIS_DURATIONS)), DURATION, max_size=2)


def clearly_refused(
    values: dict[str, Any], durations: dict[str, bool], ints: dict[str, tuple[int, int]]
) -> bool:
    """Whether a value on its own must be refused: an unknown keyword, a duration that is not a
    number from the smallest (or 0 where 0 is allowed) to the largest accepted, or a whole
    number out of its field's range."""
    for name, value in values.items():
        if name not in durations and name not in ints and name != "signing_key":
            return True
        if isinstance(value, bool) or value is None:
            continue
        if name in ints:
            least, most = ints[name]
            if isinstance(value, int) and not least <= value <= most:
                return True
            continue
        if name not in durations:
            continue
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            return True
        low = 0.0 if durations[name] else MIN_DURATION_S
        if not low <= number <= MAX_DURATION_S:  # (nan is never within)
            return True
    return False


@pytest.fixture
def no_prq_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The settings judged are the ones drawn: no PRQ_* variable is read beside them."""
    import os

    for name in [n for n in os.environ if n.startswith("PRQ_")]:
        monkeypatch.delenv(name)
    yield


def calls_made_with(queue: QueueSettings, redis: RedisSettings) -> list[Call]:
    """Every call these settings go into, built as a node builds them (nothing is sent)."""
    signer = Signer.from_settings(queue)
    ctx = Context(KeySchema("prq"), queue, "node", signer=signer, redis=redis)
    request = Request(endpoint="poll://e", method="m", id="r-1", delivery="at_least_once")
    calls = list(_enqueue_calls(ctx, request, b"{}", queue.pickup_timeout_s, True).calls)
    flows = [
        take_flow(ctx, "poll://e", "token", ThreadSignal(), 1, queue.dequeue_timeout_s),
        respond_flow(ctx, "poll://e", "r-1", "token", b"{}", queue.response_ttl_for(None)),
        withdraw_flow(ctx, request, "pickup_timeout"),
    ]
    for flow in flows:
        effect = next(flow)
        assert isinstance(effect, Exec)
        calls += effect.calls
    watch = NodeWatch(ctx, PulseRouter("prq:node:node", ThreadSignal))
    watch.send("s-1", "poll://e", 0.0)
    watch.hold(PendingRequest(request, DeliveryInfo(attempt=1, delivery_hash="h"), "t"), 0.0)
    watch.presence.took("poll://e", 0.0)
    later = queue.heartbeat_initial_delay_s + queue.poll_interval_s + 1.0
    plan = watch.plan(later)
    assert plan.beats and plan.check is not None
    calls += [call for step in plan.steps for call in step]
    assert watch.wait_s(later) <= LONGEST_WAIT_S
    return calls


def check_numbers(calls: list[Call]) -> None:
    for call in calls:
        for arg in call.args:
            if isinstance(arg, float):
                assert math.isfinite(arg), call.args
            if isinstance(arg, int | float):
                assert abs(arg) < EXACT_IN_LUA, call.args


def check_accepted(queue: QueueSettings, redis: RedisSettings) -> None:
    # Heartbeats: each side's first beat and every next one within half the shorter timeout
    timeout = min(queue.receiver_timeout_s, queue.sender_timeout_s)
    assert queue.heartbeat_initial_delay_s <= timeout / 2
    assert queue.heartbeat_interval_s <= timeout / 2

    # A take receipt outlives a failed take (given up at most its budget, a socket timeout
    # and the transport's grace after it was asked), the serve loop's longest pause, and the
    # next take's first attempt; a parked wait; a hand-off's confirmation window
    assert all(_backoff_s(failures) <= SERVE_BACKOFF_MAX_S for failures in range(1, 30))
    failed_take_s = queue.retry_budget_s + redis.socket_timeout_s + STEP_GRACE_S
    next_take_s = SERVE_BACKOFF_MAX_S + redis.connect_timeout_s + redis.socket_timeout_s
    receipt_s = queue.receipt_ttl_s(redis)
    assert receipt_s > failed_take_s + next_take_s
    assert receipt_s > 2 * queue.poll_interval_s and receipt_s > queue.handoff_confirm_s
    assert Redelivery.of(queue, redis).receipt_ttl_ms == int(receipt_s * 1000)

    # Records: a queued one outlives its pickup window; a held one the beats between and its
    # caller's judgment of a silent receiver; a locator the record
    pickup = queue.pickup_timeout_s
    assert queue.request_ttl_s(pickup) > pickup
    in_flight = queue.in_flight_ttl_s()
    assert in_flight > queue.receiver_timeout_s
    assert in_flight > max(queue.heartbeat_interval_s, queue.heartbeat_initial_delay_s)
    assert queue.locator_ttl_s(pickup) >= queue.request_ttl_s(pickup) + in_flight
    attempts = queue.max_attempts
    assert queue.signature_ttl_s(pickup, attempts) >= attempts * pickup
    assert queue.request_data_ttl_s(pickup, attempts) >= attempts * queue.request_ttl_s(pickup)

    # Data loss: a canary outlives the checks between (and a check's retries), and checks come
    # at least twice per list TTL
    ctx = Context(KeySchema("prq"), queue, "node", redis=redis)
    watch = NodeWatch(ctx, PulseRouter("prq:node:node", ThreadSignal))
    canary_s = watch.data_loss.canary_ttl_s()
    assert canary_s > queue.data_loss_check_interval_s + queue.retry_budget_s
    assert queue.data_loss_check_interval_s < DATA_LOSS_CHECK_SHARE * queue.list_ttl_s

    # Every TTL and deadline is a whole number of ms the scripts hold exactly, and every wait
    # one threads and sockets take
    derived = [
        receipt_s, queue.request_ttl_s(pickup), in_flight, queue.locator_ttl_s(pickup),
        queue.signature_ttl_s(pickup, attempts), queue.signature_renewal_s(),
        queue.request_data_ttl_s(pickup, attempts), canary_s,
        queue.response_ttl_for(MAX_DURATION_S),
    ]  # fmt: skip
    for seconds in derived:
        assert 1 <= to_ms(seconds) < EXACT_IN_LUA
    waits = [queue.dequeue_timeout_s, queue.poll_interval_s, queue.shutdown_timeout_s,
             queue.retry_budget_s, redis.socket_timeout_s, redis.connect_timeout_s]  # fmt: skip
    assert max(waits) + failed_take_s < LONGEST_WAIT_S
    kwargs = client_kwargs(redis)
    assert kwargs["socket_timeout"] == redis.socket_timeout_s
    check_numbers(calls_made_with(queue, redis))


@pytest.mark.usefixtures("no_prq_environment")
@settings(
    max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(queue_values(), redis_values())
# (the cases, and ints too large for a float where other settings follow them)
@example({"pickup_timeout_s": math.inf}, {})
@example({"pikup_timeout_s": 3}, {})
@example({"data_loss_check_interval_s": 50_000}, {})
@example({"receiver_timeout_s": 10**400}, {"socket_timeout_s": math.inf})
@example({"list_ttl_s": 10**400, "sender_timeout_s": "1e400"}, {"connect_timeout_s": math.nan})
def test_settings_are_refused_at_once_or_work(
    queue_kwargs: dict[str, Any], redis_kwargs: dict[str, Any]
) -> None:
    # When the settings are built
    try:
        queue: QueueSettings | None = QueueSettings(**queue_kwargs)
    except InvalidSettings:
        queue = None  # Then a refusal is InvalidSettings (anything else fails the test)
    try:
        redis: RedisSettings | None = RedisSettings(**redis_kwargs)
    except InvalidSettings:
        redis = None

    event(f"queue settings {'accepted' if queue else 'refused'}")
    # Then what must be refused is
    if clearly_refused(queue_kwargs, QUEUE_DURATIONS, QUEUE_INTS):
        assert queue is None, f"accepted {queue_kwargs}"
    if clearly_refused(redis_kwargs, REDIS_DURATIONS, {}):
        assert redis is None, f"accepted {redis_kwargs}"
    # And what is accepted works
    if queue is not None and redis is not None:
        check_accepted(queue, redis)
