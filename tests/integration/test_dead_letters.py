"""Dead letters (prq.protocol.dead): malformed bytes in Redis never stall a receiver and are kept
with a reason; dead letters are listed, replayed once, purged, and bounded."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client import REGISTRY

from prq import Request, RequestState, Response
from prq.protocol.dead import dead_letter_call
from prq.protocol.effects import Call
from tests.queue_facades import AnyQueue, QueueFactory, wait_for_state
from tests.queued import queued_ids
from tests.stored_bodies import write_body

pytestmark = pytest.mark.integration


class _Exploit:
    """Unpickling this would create a file: proof that nothing ever unpickles stored bytes."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def malformed_bodies(marker: Path) -> dict[str, bytes]:
    return {
        "truncated": b'{"endpoint": "poll://dead", "method": "m", "params": {"a": ',
        "pickle": pickle.dumps(_Exploit(marker)),
        "yaml": b"!!python/object/apply:os.system ['true']\nendpoint: poll://dead\n",
        "wrong types": json.dumps({"endpoint": 5, "method": [], "id": {}}).encode(),
        "other endpoint": Request(endpoint="poll://elsewhere", method="m")
        .model_dump_json()
        .encode(),
        "huge": b"\xff" * 2_000_000,
    }


def dead_lettered(endpoint: str) -> float:
    """This process's prq_dead_lettered_total for `endpoint`."""
    found = REGISTRY.get_sample_value("prq_dead_lettered_total", {"endpoint": endpoint})
    return found or 0.0


def send(client: redis.Redis, call: Call) -> None:
    """Run a prepared script call (the node loaded the scripts when it started)."""
    client.execute_command(*call.args)  # type: ignore[no-untyped-call]


async def enqueue_waiting(sender: AnyQueue, endpoint: str, n: int) -> tuple[list[Request], Any]:
    requests = [Request(endpoint=endpoint, method="m", params=i) for i in range(n)]
    calls = asyncio.gather(
        *(sender.queue_and_wait(r, timeout_s=30) for r in requests), return_exceptions=True
    )
    for request in requests:
        await wait_for_state(sender, request.id, RequestState.QUEUED)
    return requests, calls


async def test_malformed_bytes_are_dead_lettered_and_the_receiver_keeps_serving(
    make_queue: QueueFactory, redis_client: redis.Redis, tmp_path: Path
) -> None:
    # Given queued requests whose stored bytes an attacker (or a bug) replaced with garbage
    endpoint = "poll://dead"
    sender = make_queue()
    marker = tmp_path / "unpickled"
    bodies = malformed_bodies(marker)
    requests, calls = await enqueue_waiting(sender, endpoint, len(bodies) + 1)
    keys = sender.keys.endpoint(endpoint)
    for request, body in zip(requests, bodies.values(), strict=False):
        write_body(redis_client, keys.request(request.id), body)
    served: list[object] = []
    counted_before = dead_lettered(endpoint)

    def handler(request: Request) -> object:
        served.append(request.params)
        return request.params

    # When a receiver serves the endpoint
    make_queue.serve(make_queue(), endpoint, handler, concurrency=2)
    outcomes = await asyncio.wait_for(calls, 30)

    # Then every caller of a garbage request gets a SerializationError, the good one its answer
    for outcome in outcomes[:-1]:
        assert isinstance(outcome, Response) and outcome.error is not None, outcome
        assert outcome.error.type == "SerializationError"
    assert isinstance(outcomes[-1], Response) and outcomes[-1].result == len(bodies)
    assert served == [len(bodies)]
    # And each garbage request is a dead letter with its reason and its exact stored bytes
    letters = {d.id: d for d in await sender.dead_letters(endpoint)}
    assert set(letters) == {r.id for r in requests[:-1]}
    for request, body in zip(requests, bodies.values(), strict=False):
        letter = letters[request.id]
        assert letter.reason.startswith("undecodable:"), letter
        assert (letter.attempts, letter.body_bytes) == (1, len(body))
        assert letter.endpoint == endpoint and letter.dead_at_ms > 0
    assert len(letters[requests[-2].id].body_preview) <= 1024 * 4
    # And nothing was ever unpickled
    assert not marker.exists()
    # And the process's counter says how many it dead-lettered
    assert dead_lettered(endpoint) - counted_before == len(bodies)


async def test_a_dead_letter_is_replayed_once_and_purged(
    make_queue: QueueFactory, redis_client: redis.Redis
) -> None:
    # Given two requests dead-lettered with their (valid) bytes, e.g. after exhausted attempts
    endpoint = "poll://dead-replay"
    node = make_queue()
    await node.start()
    requests = [Request(endpoint=endpoint, method="m", params=i) for i in range(3)]
    ctx = node.ctx
    for request in requests:
        call = dead_letter_call(
            ctx, endpoint, request.id, request.model_dump_json().encode(), "attempts_exhausted", 3
        )
        send(redis_client, call)
    listed = await node.dead_letters(endpoint)
    assert [d.id for d in listed] == [r.id for r in reversed(requests)]  # newest first
    assert {d.reason for d in listed} == {"attempts_exhausted"}

    # When one is replayed twice
    first = await node.replay_dead_letter(endpoint, requests[0].id)
    second = await node.replay_dead_letter(endpoint, requests[0].id)

    # Then it is queued once, and no longer a dead letter
    assert (first, second) == ("replayed", "missing")
    keys = node.keys.endpoint(endpoint)
    assert queued_ids(redis_client, keys) == [requests[0].id.encode()]
    status = await node.status(requests[0].id)
    assert status.state == RequestState.QUEUED
    # And a receiver runs it like any request
    taken = await make_queue().dequeue(endpoint, timeout_s=5)
    assert taken is not None and taken.request == requests[0]
    # And purging drops the named ones (none for an empty list), then all
    assert await node.purge_dead_letters(endpoint, []) == 0
    assert len(await node.dead_letters(endpoint)) == 2
    assert await node.purge_dead_letters(endpoint, [requests[1].id, "no-such-id"]) == 1
    assert [d.id for d in await node.dead_letters(endpoint)] == [requests[2].id]
    assert await node.purge_dead_letters(endpoint) == 1
    assert await node.dead_letters(endpoint) == []
    assert not any(redis_client.exists(k) for k in keys.dead)


async def test_dead_letters_are_bounded_in_number_and_age(
    make_queue: QueueFactory, redis_client: redis.Redis
) -> None:
    # Given an endpoint that keeps at most 3 dead letters, for an hour
    endpoint = "poll://dead-bounded"
    node = make_queue(dead_letter_max=3, dead_letter_ttl_s=3600)
    await node.start()
    ids_key, details_key, bodies_key = node.keys.endpoint(endpoint).dead
    # and an entry older than that hour, left from before
    old_ms = int(time.time() * 1000) - 2 * 3600 * 1000
    redis_client.zadd(ids_key, {"ancient": old_ms})
    redis_client.hset(details_key, "ancient", "{}")
    redis_client.hset(bodies_key, "ancient", b"x")

    # When five more are dead-lettered
    for i in range(5):
        call = dead_letter_call(node.ctx, endpoint, f"late-{i}", b"{}", "undecodable: test", 1)
        send(redis_client, call)

    # Then the old one is gone, only the 3 newest stay, in all three keys, each with a TTL
    assert [d.id for d in await node.dead_letters(endpoint)] == ["late-4", "late-3", "late-2"]
    for key in (details_key, bodies_key):
        assert sorted(redis_client.hkeys(key)) == [b"late-2", b"late-3", b"late-4"]
    for key in (ids_key, details_key, bodies_key):
        assert 0 < redis_client.pttl(key) <= 3600 * 1000
