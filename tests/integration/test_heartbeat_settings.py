"""A call that outlasts both timeouts completes under every heartbeat setting QueueSettings
accepts: a first beat at once, one interval in, at its largest; an interval at its largest
relative to the shorter timeout; heartbeats left unset (derived from the timeouts). Neither
side is declared lost, and the caller gets its answer.

The cases of one facade run at once (each with its own sender, receiver and endpoint), so the
whole matrix costs about one long call per facade.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from prq import Request
from prq.core.keys import KeySchema
from tests.queue_facades import QueueFactory, run_all

pytestmark = pytest.mark.integration

#: Heartbeat settings at the edges of what QueueSettings accepts, with timeouts of a couple of
#: seconds (accepted: a first beat and an interval of at most half the shorter timeout).
CASES: dict[str, dict[str, Any]] = {
    # the case: a first beat at once (before the caller's enqueue reaches Redis)
    "first beat at once": {
        "heartbeat_initial_delay_s": 0,
        "heartbeat_interval_s": 0.2,
        "receiver_timeout_s": 2,
        "sender_timeout_s": 2,
    },
    "first beat at once, interval at its largest": {
        "heartbeat_initial_delay_s": 0,
        "heartbeat_interval_s": 1,
        "receiver_timeout_s": 2,
        "sender_timeout_s": 2,
    },
    "first beat one interval in": {
        "heartbeat_initial_delay_s": 0.5,
        "heartbeat_interval_s": 0.5,
        "receiver_timeout_s": 2,
        "sender_timeout_s": 2,
    },
    "first beat and interval at their largest": {
        "heartbeat_initial_delay_s": 1,
        "heartbeat_interval_s": 1,
        "receiver_timeout_s": 2,
        "sender_timeout_s": 2,
    },
    "first beat late, short interval": {
        "heartbeat_initial_delay_s": 1,
        "heartbeat_interval_s": 0.2,
        "receiver_timeout_s": 2,
        "sender_timeout_s": 2,
    },
    "largest, the receiver timeout shorter": {
        "heartbeat_initial_delay_s": 0.75,
        "heartbeat_interval_s": 0.75,
        "receiver_timeout_s": 1.5,
        "sender_timeout_s": 2.5,
    },
    "largest, the sender timeout shorter": {
        "heartbeat_initial_delay_s": 0.75,
        "heartbeat_interval_s": 0.75,
        "receiver_timeout_s": 2.5,
        "sender_timeout_s": 1.5,
    },
    "unset: derived from the timeouts": {"receiver_timeout_s": 1.5, "sender_timeout_s": 2},
    "unset: derived from the sender timeout": {"receiver_timeout_s": 2, "sender_timeout_s": 1.5},
}


async def test_a_call_outlasting_both_timeouts_completes_under_every_heartbeat_setting(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    async def long_call(
        case: int, name: str, timings: dict[str, Any]
    ) -> tuple[object, dict[str, Any]]:
        # Given a sender and a receiver with these heartbeat settings, and a handler that
        # works a second longer than either timeout
        sender, receiver = make_queue(**timings), make_queue(**timings)
        endpoint = f"poll://beats-{case}"
        work_s = max(sender.settings.receiver_timeout_s, sender.settings.sender_timeout_s) + 1
        seen: dict[str, Any] = {}

        def handler(request: Request) -> Any:
            time.sleep(work_s)  # the handler's work
            # (read before the answer: both sides beat while it worked)
            stored = KeySchema(key_prefix).endpoint(endpoint).request(request.id)
            seen["beats"] = redis_client.hmget(stored, ["hs", "hr", "st"])
            return f"answer to {request.params}"

        make_queue.serve(receiver, endpoint, handler)
        # When a call is made
        started = time.monotonic()
        result = await sender.call(endpoint, "m", name, timeout_s=work_s + 10)
        seen["elapsed"] = time.monotonic() - started
        return result, seen

    calls = [long_call(case, name, t) for case, (name, t) in enumerate(CASES.items())]
    outcomes = await run_all(calls, timeout_s=40)

    # Then each call returns its answer (the caller was not judged lost: its receiver would
    # have cancelled the request, sender_lost; nor the receiver: ReceiverLost), after the
    # handler's work, and the record shows beats of both sides
    for name, (result, seen) in zip(CASES, outcomes, strict=True):
        print(f"{name}: {seen['elapsed']:.2f} s, record (hs, hr, st) {seen['beats']}")
        assert result == f"answer to {name}", name
        hs, hr, state = seen["beats"]
        assert state == b"taken", name
        assert hs is not None and hr is not None, f"{name}: no beat of a side ({hs=}, {hr=})"
