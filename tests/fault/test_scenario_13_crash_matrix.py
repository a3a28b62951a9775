"""Scenario 13: the at_least_once crash matrix. A receiver is killed (SIGKILL) at each step
boundary of a request: after the take, after the handler ran, after the response was written
(its pulse goes in the same atomic step, so "before the pulse" is that point too). With a
handler that dedupes its side effect on the delivery hash, every input yields exactly one
output, and every caller gets it.

The crashing receiver is a process of its own (tests/fault/crash_receiver.py); once it is dead,
a live receiver in the test process serves the endpoint with the same handler.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from prq import AsyncQueue, QueueSettings, Request
from prq.core.keys import KeySchema
from prq.embedded import EmbeddedRedis
from prq.protocol.dedup import delivery_hash
from tests.fault.crash_receiver import CRASH_POINTS, DedupingService
from tests.redis_servers import async_wait_until, wait_until

pytestmark = pytest.mark.fault

ROOT = Path(__file__).resolve().parents[2]
ENDPOINT = "poll://crash-matrix"
#: Requests per crash point.
REQUESTS = 6
#: Quick judgments: a silent receiver is noticed within about a second.
TIMINGS: dict[str, Any] = {
    "receiver_timeout_s": 1.0,
    "heartbeat_interval_s": 0.3,
    "heartbeat_initial_delay_s": 0.2,
    "sender_timeout_s": 5.0,
    "poll_interval_s": 0.2,
    "pickup_timeout_s": 30.0,
    "max_attempts": 3,
}


@pytest.mark.parametrize("point", CRASH_POINTS)
async def test_every_input_yields_exactly_one_output_whatever_step_the_receiver_dies_at(
    fault_redis: EmbeddedRedis, fault_client: redis.Redis, fault_prefix: str, tmp_path: Path,
    point: str,
) -> None:  # fmt: skip
    # Given a receiver process that will be killed at `point` of the first request it handles
    ready = tmp_path / "ready"
    config = {
        "url": fault_redis.url, "prefix": fault_prefix, "endpoint": ENDPOINT, "crash_at": point,
        "settings": TIMINGS, "ready": str(ready), "max_lifetime_s": 60,
    }  # fmt: skip
    crashing = subprocess.Popen(
        [sys.executable, "-m", "tests.fault.crash_receiver", json.dumps(config)],
        cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until(ready.exists, 30, 0.05, "the crashing receiver serves")

        # When a caller sends at_least_once requests, and the receiver dies at that point
        settings = QueueSettings(**TIMINGS)
        async with AsyncQueue.from_url(fault_redis.url, prefix=fault_prefix, settings=settings) as (
            sender
        ):
            requests = [
                Request(endpoint=ENDPOINT, method="work", params=f"input-{i}",
                        delivery="at_least_once")
                for i in range(REQUESTS)
            ]  # fmt: skip
            calls = [asyncio.ensure_future(sender.queue_and_wait(r)) for r in requests]
            await async_wait_until(
                lambda: crashing.poll() is not None, 30, 0.05, "the receiver died"
            )
            assert crashing.returncode == -9
            assert fault_client.get(f"{fault_prefix}:test:crashed") == point.encode()

            # And a live receiver serves the endpoint with the same handler
            service = DedupingService(fault_redis.url, fault_prefix)
            stop = asyncio.Event()
            async with AsyncQueue.from_url(
                fault_redis.url, prefix=fault_prefix, settings=settings
            ) as receiver:
                serving = asyncio.ensure_future(
                    receiver.serve(ENDPOINT, service, concurrency=4, stop=stop)
                )
                responses = await asyncio.wait_for(asyncio.gather(*calls), 30)
                stop.set()
                await asyncio.wait_for(serving, 10)
    finally:
        crashing.kill()
        crashing.wait(10)

    # Then every caller got its own input's output, and each input has exactly one output
    assert [r.result for r in responses] == [r.params for r in requests]
    hashes = {request.id: delivery_hash(ENDPOINT, request.id) for request in requests}
    outputs = {rid: fault_client.get(service.output_key(h)) for rid, h in hashes.items()}
    assert outputs == {r.id: json.dumps(r.params).encode() for r in requests}
    assert len(list(fault_client.scan_iter(f"{fault_prefix}:test:out:*"))) == REQUESTS
    # And what ran twice is what the crash cut short: the side effect done, no answer written
    runs = {
        request.id: int(
            fault_client.get(service.runs_key(delivery_hash(ENDPOINT, request.id))) or 0
        )
        for request in requests
    }
    assert all(count >= 1 for count in runs.values()), runs
    twice = [request_id for request_id, count in runs.items() if count > 1]
    assert len(twice) == (1 if point == "after_handler" else 0), runs
    # And the request the receiver died holding was handed out a second time (an answered one
    # never is); nothing was dead-lettered
    keys = KeySchema(fault_prefix).endpoint(ENDPOINT)
    attempts = [int(fault_client.hget(keys.request(r.id), "att") or 0) for r in requests]
    assert max(attempts) == (1 if point == "after_response" else 2), attempts
    assert fault_client.zcard(keys.dead[0]) == 0
