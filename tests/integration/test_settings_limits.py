"""Settings at the edges: one that would break every call later (an infinite timeout, a field
misspelt, a data-loss check interval too long for a rollback to show) is refused when settings are
built, before anything reaches Redis; and one at the largest values accepted works end to end,
every TTL and deadline derived from it one that Redis and the scripts take."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
import redis

from prq import InvalidSettings, Request
from prq.core.bounds import MAX_DURATION_S
from prq.core.keys import KeySchema
from tests.queue_facades import FAST_SETTINGS, QueueFactory

pytestmark = pytest.mark.integration

#: Every duration at the largest value accepted: ten years, the first beat and the interval at
#: half the timeouts, the data-loss checks below half the list TTL.
LARGEST: dict[str, Any] = {
    name: MAX_DURATION_S
    for name in (
        "pickup_timeout_s", "dequeue_timeout_s", "poll_interval_s", "receiver_timeout_s",
        "sender_timeout_s", "handoff_confirm_s", "retry_budget_s", "response_ttl_s",
        "max_response_ttl_s", "request_ttl_extra_s", "list_ttl_s", "cancel_marker_ttl_s",
        "dead_letter_ttl_s", "shutdown_timeout_s", "signing_clock_skew_s",
    )
} | {
    "heartbeat_interval_s": MAX_DURATION_S / 2,
    "heartbeat_initial_delay_s": MAX_DURATION_S / 2,
    "data_loss_check_interval_s": MAX_DURATION_S / 4,
    "max_attempts": 1000,
    "request_locators": True,
    "signing_key": "k" * 32,
}  # fmt: skip


@pytest.mark.parametrize(
    "bad",
    [
        {"pickup_timeout_s": math.inf},
        {"pikup_timeout_s": 3},
        {"data_loss_check_interval_s": 50_000},
        {"receiver_timeout_s": math.nan},
        {"receiver_timeout_s": 10**400},
    ],
    ids=["infinite", "misspelt", "unvouched-checks", "nan", "too-large-for-a-float"],
)
async def test_settings_that_would_break_calls_are_refused_when_built(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str, bad: dict[str, Any]
) -> None:
    # When a queue is made with such a setting, Then it is refused there, naming the setting
    with pytest.raises(InvalidSettings, match=next(iter(bad))):
        make_queue(**bad)
    # And nothing reached Redis
    assert not list(redis_client.scan_iter(match=f"{key_prefix}*", count=1000))


async def test_a_queue_at_the_largest_settings_accepted_answers_calls(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given a sender and a receiver with every duration at the largest value accepted
    assert set(FAST_SETTINGS) <= set(LARGEST)
    sender, receiver = make_queue(**LARGEST), make_queue(**LARGEST)
    make_queue.serve(receiver, "poll://largest", lambda request: request.params)
    request = Request(endpoint="poll://largest", method="m", params=7, delivery="at_least_once")

    # When a call is made, Then it is answered (no TTL refused, no wait overflowing)
    response = await asyncio.wait_for(sender.queue_and_wait(request), 20)
    assert response.result == 7
    # And the answer is kept as long as asked, in Redis's own terms
    keys = KeySchema(key_prefix).endpoint("poll://largest")
    assert redis_client.pttl(keys.request(request.id)) > (MAX_DURATION_S - 60) * 1000
