"""Bodies over inline_limit_bytes kept beside Redis (prq.core.bodies), on real Redis and a real
shared directory.

A request or response whose JSON is over the limit is written to the DataStreamStore; Redis
keeps a marker (reference, length, SHA-256) and a stub without the payload. Readers get the
whole body back and check it; what cannot be read is dead-lettered (receiver) or raised
(caller), never run or returned half.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

import pytest
import redis

from prq import (
    ConfigurationError,
    PickupTimeout,
    QueueSettings,
    Request,
    Response,
    SerializationError,
)
from prq.bulk import BulkClient
from prq.core.bodies import MARKER, parse
from prq.core.keys import KeySchema
from prq.core.models import encode_stored_request
from prq.datastreams import DataStream, FileSystemStore
from prq.ops.inspector import Inspector
from tests.queue_facades import QueueFactory, run_all
from tests.redis_servers import async_wait_until
from tests.stored_bodies import read_body

pytestmark = pytest.mark.integration

ENDPOINT = "poll://large-bodies"
LIMIT = 4096
SETTINGS: dict[str, Any] = {"inline_limit_bytes": LIMIT, "max_body_bytes": 4 * 1024 * 1024}


def stored(store: FileSystemStore) -> list[str]:
    return sorted(name for name in os.listdir(store.directory) if not name.startswith("."))


def stored_request_body(redis_client: redis.Redis, prefix: str, request_id: str) -> bytes:
    body = read_body(redis_client, KeySchema(prefix).endpoint(ENDPOINT).request(request_id))
    assert body is not None
    return body


def request_hash(redis_client: redis.Redis, prefix: str, request_id: str) -> dict[bytes, bytes]:
    found = redis_client.hgetall(KeySchema(prefix).endpoint(ENDPOINT).request(request_id))
    assert isinstance(found, dict)
    return {_raw(k): _raw(v) for k, v in found.items()}


def _raw(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


@pytest.mark.parametrize("pulse_inline", [16384, 0], ids=["answer-in-pulse", "answer-read"])
async def test_large_request_and_response_bodies_go_beside_redis(
    make_queue: QueueFactory,
    redis_client: redis.Redis,
    key_prefix: str,
    tmp_path: Path,
    pulse_inline: int,
) -> None:
    # Given two nodes sharing a store, with a 4 KiB inline limit
    store = FileSystemStore(tmp_path / "store")
    settings = SETTINGS | {"pulse_inline_limit_bytes": pulse_inline}
    caller = make_queue(datastreams=store, **settings)
    receiver = make_queue(datastreams=store, **settings)
    params = {"text": "x" * 300_000, "n": 7}
    request = Request(endpoint=ENDPOINT, method="echo", params=params, headers={"h": "v"})
    seen: dict[str, Any] = {}

    async def serve() -> None:
        pending = await receiver.dequeue(ENDPOINT, timeout_s=10)
        assert pending is not None
        seen["request"] = pending.request
        seen["stored"] = stored_request_body(redis_client, key_prefix, pending.id)
        seen["files"] = stored(store)
        await receiver.apply_response(Response(id=pending.id, result={"back": "y" * 200_000}))

    # When the request is called and answered with a large result
    response, _ = await run_all([caller.queue_and_wait(request, timeout_s=20), serve()], 30)

    # Then the receiver got the whole request, though Redis held only a marker and a stub
    assert seen["request"] == request.model_copy(update={"producer": caller.node_id})
    body = seen["stored"]
    assert body.startswith(MARKER) and len(body) < 1024
    assert b"x" * 100 not in body and b'"m":"echo"' in body
    assert len(seen["files"]) == 1
    # And the caller got the whole response, whose stored form is a marker too
    assert response.result == {"back": "y" * 200_000}
    stored_response = request_hash(redis_client, key_prefix, request.id)[b"rsp"]
    assert stored_response.startswith(MARKER) and len(stored_response) < 1024
    # And the request's body is gone once answered; the response's is kept as long as the
    # response (a retry with the same id reads it again), then swept
    response_ref = parse(stored_response).reference
    assert stored(store) == [response_ref]
    expires_ms = int(response_ref.split("-")[0])
    ttl_ms = int(caller.settings.response_ttl_s * 1000)
    assert abs(expires_ms - (time.time() * 1000 + ttl_ms)) < 60_000
    again = await caller.queue_and_wait(request, timeout_s=10)
    assert again.result == response.result
    assert response_ref in stored(store)  # (beside the retry's own copy, never used)
    assert store.cleanup(expires_ms - 1) == 0
    assert store.cleanup(expires_ms + 1) == 1
    # (the retry's copy lives as long as a request's data may be needed: see test_data_lifetime)
    life_ms = int(caller.settings.request_data_ttl_s(caller.settings.pickup_timeout_s, 1) * 1000)
    assert store.cleanup(int(time.time() * 1000) + life_ms + 60_000) == 1
    assert stored(store) == []


async def test_the_inline_limit_is_inclusive_and_a_node_without_a_store_keeps_bodies_inline(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str, tmp_path: Path
) -> None:
    # Given a body of exactly the limit, and one a byte over it
    store = FileSystemStore(tmp_path / "store")
    caller = make_queue(datastreams=store, **SETTINGS)
    bare = make_queue(**SETTINGS)
    receiver = make_queue(datastreams=store, **SETTINGS)

    def sized(size: int, request_id: str) -> Request:
        fields: dict[str, Any] = {"endpoint": ENDPOINT, "method": "m", "producer": "p"}
        probe = Request(params="", id=request_id, **fields)
        pad = size - len(encode_stored_request(probe))
        return Request(params="p" * pad, id=request_id, **fields)

    async def stored_body(queue: Any, request: Request) -> bytes:
        """The request's body as Redis holds it while it is taken; then it is answered."""
        call = asyncio.ensure_future(queue.queue_and_wait(request, timeout_s=20))
        pending = await receiver.dequeue(ENDPOINT, timeout_s=10)
        assert pending is not None and pending.request == request
        body = stored_request_body(redis_client, key_prefix, request.id)
        await receiver.apply_response(Response(id=pending.id, result="ok"))
        assert (await asyncio.wait_for(call, 10)).result == "ok"
        return body

    at_limit = sized(LIMIT, "at-limit")
    assert len(encode_stored_request(at_limit)) == LIMIT
    # When each is called, the second also from a node without a store
    inline = await stored_body(caller, at_limit)
    over = await stored_body(caller, sized(LIMIT + 1, "over-limit"))
    no_store = await stored_body(bare, sized(LIMIT + 1, "no-store"))
    # Then only the one over the limit, from a node with a store, went beside Redis
    assert inline.startswith(b"{") and len(inline) == LIMIT
    assert over.startswith(MARKER)
    assert no_store.startswith(b"{") and len(no_store) == LIMIT + 1
    assert stored(store) == []  # (answered: the request's body deleted)


def _tamper(store: FileSystemStore) -> None:
    (name,) = stored(store)
    path = store.directory / name
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x01
    path.write_bytes(bytes(data))


def _remove(store: FileSystemStore) -> None:
    (name,) = stored(store)
    (store.directory / name).unlink()


@pytest.mark.parametrize(
    ("damage", "reason"),
    [(_tamper, "SHA-256"), (_remove, "not in"), (None, "no DataStreamStore")],
    ids=["changed", "missing", "receiver-without-store"],
)
async def test_a_request_body_that_cannot_be_read_is_dead_lettered_never_run(
    make_queue: QueueFactory, tmp_path: Path, damage: Any, reason: str
) -> None:
    # Given a large request whose stored body is changed, missing, or out of the receiver's
    # reach (it has no store)
    store = FileSystemStore(tmp_path / "store")
    sender = make_queue(datastreams=store, **SETTINGS)
    receiver = (
        make_queue(**SETTINGS) if damage is None else make_queue(datastreams=store, **SETTINGS)
    )
    runs: list[str] = []
    request = Request(endpoint=ENDPOINT, method="m", params="z" * 10_000)
    call = asyncio.ensure_future(sender.queue_and_wait(request, timeout_s=20))
    await async_wait_until(lambda: len(stored(store)) == 1, 10, 0.02, "the body stored")
    if damage is not None:
        damage(store)

    # When the receiver serves the endpoint
    def run(request: Request) -> str:
        runs.append(request.id)
        return "ran"

    serving = make_queue.serve(receiver, ENDPOINT, run)
    response = await asyncio.wait_for(call, 20)
    await serving.stop()
    # Then the service never saw it; the caller is told why, and the dead letter says so
    assert runs == []
    assert response.error is not None and reason in response.error.message
    (letter,) = await receiver.dead_letters(ENDPOINT)
    assert letter.id == request.id and reason in letter.reason
    if damage is None:
        # And nothing is lost: a receiver given the store runs it on replay
        fixed = make_queue(datastreams=store, **SETTINGS)
        got: list[Any] = []

        def run_fixed(request: Request) -> str:
            got.append(request.params)
            return "ran"

        serving = make_queue.serve(fixed, ENDPOINT, run_fixed)
        await fixed.replay_dead_letter(ENDPOINT, request.id)
        await async_wait_until(lambda: got == [request.params], 10, 0.02, "the replay ran")
        await serving.stop()


async def test_a_response_body_that_cannot_be_read_raises_for_the_caller(
    make_queue: QueueFactory, tmp_path: Path
) -> None:
    # Given a large response whose stored body is removed before the caller reads it
    store = FileSystemStore(tmp_path / "store")
    caller_store = FileSystemStore(tmp_path / "elsewhere")  # not the receiver's directory
    caller = make_queue(datastreams=caller_store, **SETTINGS, pulse_inline_limit_bytes=0)
    receiver = make_queue(datastreams=store, **SETTINGS)
    request = Request(endpoint=ENDPOINT, method="m")

    async def serve() -> None:
        pending = await receiver.dequeue(ENDPOINT, timeout_s=10)
        assert pending is not None
        await receiver.apply_response(Response(id=pending.id, result="r" * 10_000))

    # When it waits for the answer
    results = await asyncio.gather(
        caller.queue_and_wait(request, timeout_s=20), serve(), return_exceptions=True
    )
    # Then it gets a clear error that says the request ran, not a half answer
    error = results[0]
    assert isinstance(error, SerializationError), results
    assert error.maybe_executed and "not in" in str(error)
    # And a caller without any store is told to configure one
    bare = make_queue(**SETTINGS, pulse_inline_limit_bytes=0)
    with pytest.raises(ConfigurationError, match="no DataStreamStore") as raised:
        await bare.queue_and_wait(request, timeout_s=10)  # the same id: the stored answer
    assert raised.value.maybe_executed


async def test_signed_large_bodies_round_trip(make_queue: QueueFactory, tmp_path: Path) -> None:
    # Given signing on: the marker is signed, and it names the body's SHA-256
    store = FileSystemStore(tmp_path / "store")
    signed: dict[str, Any] = SETTINGS | {"signing_key": "k" * 32}
    caller = make_queue(datastreams=store, **signed)
    receiver = make_queue(datastreams=store, **signed)
    serving = make_queue.serve(receiver, ENDPOINT, lambda r: {"len": len(r.params["p"]) * "q"})
    # When a large request is answered with a large result
    request = Request(endpoint=ENDPOINT, method="m", params={"p": "s" * 50_000})
    response = await caller.queue_and_wait(request, timeout_s=20)
    # Then both come back whole
    assert response.result == {"len": "q" * 50_000}
    await serving.stop()


async def test_a_withdrawn_or_one_way_request_leaves_no_body_behind(
    make_queue: QueueFactory, tmp_path: Path
) -> None:
    store = FileSystemStore(tmp_path / "store")
    caller = make_queue(datastreams=store, **SETTINGS)
    # A large request nobody picks up is withdrawn, and its body deleted by its caller
    lonely = Request(endpoint="poll://nobody", method="m", params="w" * 10_000)
    with pytest.raises(PickupTimeout):
        await caller.queue_and_wait(lonely, pickup_timeout_s=0.5, timeout_s=10)
    assert stored(store) == []
    # A large one-way message is read by its receiver, which deletes the body once answered
    receiver = make_queue(datastreams=store, **SETTINGS)
    got: list[int] = []
    serving = make_queue.serve(receiver, ENDPOINT, lambda r: got.append(len(r.params)))
    await caller.notify(ENDPOINT, "m", "n" * 20_000)
    await async_wait_until(lambda: got == [20_000] and stored(store) == [], 10, 0.02, "answered")
    await serving.stop()


async def test_admin_views_show_a_large_request_by_its_stub(
    make_queue: QueueFactory, redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    # Given a large request waiting in the queue
    store = FileSystemStore(tmp_path / "store")
    caller = make_queue(datastreams=store, **SETTINGS)
    request = Request(
        endpoint=ENDPOINT, method="big", service="svc", params="b" * 9_000, producer="me"
    )
    call = asyncio.ensure_future(caller.queue_and_wait(request, pickup_timeout_s=3))
    # When an operator lists the queue
    async with Inspector.from_url(redis_url, prefix=key_prefix) as inspector:

        async def listed() -> list[Any]:
            return list((await inspector.queued(ENDPOINT)).items)

        await async_wait_until(listed, 10, 0.02, "the request listed")
        (item,) = await listed()
    # Then it shows what the request is and its real size, without an error
    assert (item.id, item.method, item.service, item.error) == (request.id, "big", "svc", None)
    assert item.body_bytes == len(encode_stored_request(request))
    with pytest.raises(PickupTimeout):
        await asyncio.wait_for(call, 10)


class _GatedStore(FileSystemStore):
    """A FileSystemStore whose reads wait until the test opens the gate (bounded)."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.reading = threading.Event()
        self.gate = threading.Event()

    def rehydrate(self, reference: str) -> BinaryIO:
        self.reading.set()
        if not self.gate.wait(10):
            raise AssertionError("the gate was never opened")
        return super().rehydrate(reference)


@pytest.mark.parametrize("facade", ["async"], indirect=True)
async def test_reading_a_large_body_does_not_block_the_event_loop(
    make_queue: QueueFactory, tmp_path: Path
) -> None:
    # Given a receiver whose store reads stall until released
    store = _GatedStore(tmp_path / "store")
    caller = make_queue(datastreams=FileSystemStore(store.directory), **SETTINGS)
    receiver = make_queue(datastreams=store, **SETTINGS)
    request = Request(endpoint=ENDPOINT, method="m", params="g" * 10_000)
    call = asyncio.ensure_future(caller.queue_and_wait(request, timeout_s=20))
    take = asyncio.ensure_future(receiver.dequeue(ENDPOINT, timeout_s=10))
    # When the receiver is reading the body
    await async_wait_until(store.reading.is_set, 10, 0.01, "the read started")
    # Then the event loop runs on while the read waits (this line runs with the gate shut)
    assert not store.gate.is_set() and not take.done()
    store.gate.set()
    pending = await asyncio.wait_for(take, 10)
    assert pending is not None and pending.request.params == "g" * 10_000
    await receiver.apply_response(Response(id=pending.id, result=json.dumps("done")))
    assert (await asyncio.wait_for(call, 10)).result == '"done"'


async def test_the_bulk_client_keeps_large_bodies_beside_redis_too(
    make_queue: QueueFactory, redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    # Given a bulk client and a receiver sharing a store
    store = FileSystemStore(tmp_path / "store")
    settings = QueueSettings(**SETTINGS)
    receiver = make_queue(datastreams=store, **SETTINGS)
    serving = make_queue.serve(receiver, ENDPOINT, lambda r: {"got": r.params, "pad": "a" * 9000})
    requests = [
        Request(endpoint=ENDPOINT, method="m", params="L" * 9000, id="bulk-large"),
        Request(endpoint=ENDPOINT, method="m", params="small", id="bulk-small"),
    ]
    with BulkClient.from_url(
        redis_url, prefix=key_prefix, settings=settings, datastreams=store
    ) as bulk:
        # When it enqueues a large and a small request, and reads their outcomes
        assert bulk.enqueue_many(requests).accepted == 2

        def answered() -> bool:
            return all(
                s.state == "done"
                for s in bulk.outcomes(ENDPOINT, ["bulk-large", "bulk-small"]).values()
            )

        await async_wait_until(answered, 10, 0.02, "both answered")
        outcomes = bulk.outcomes(ENDPOINT, ["bulk-large", "bulk-small"])
        results = {rid: bulk.resolve(snap, rid, ENDPOINT) for rid, snap in outcomes.items()}
    await serving.stop()
    # Then both requests and answers came through whole
    assert results["bulk-large"] is not None and results["bulk-small"] is not None
    assert results["bulk-large"].result == {"got": "L" * 9000, "pad": "a" * 9000}
    assert results["bulk-small"].result == {"got": "small", "pad": "a" * 9000}
    # And only the two answers' bodies are left in the store (the requests' were deleted)
    assert len(stored(store)) == 2


async def test_a_refused_late_answer_leaves_the_body_and_streams_to_the_new_receiver(
    make_queue: QueueFactory, tmp_path: Path
) -> None:
    # Given an at_least_once request with a large body and a stream, taken by a receiver whose
    # first beat comes late (4 s), and a caller that judges receivers silent after 1 s
    store = FileSystemStore(tmp_path / "store")
    quick: dict[str, Any] = {
        "receiver_timeout_s": 1.0,
        "heartbeat_interval_s": 0.3,
        "heartbeat_initial_delay_s": 0.2,
    }
    slow: dict[str, Any] = {
        "receiver_timeout_s": 8,
        "heartbeat_initial_delay_s": 4,
        "heartbeat_interval_s": 2,
    }
    sender = make_queue(datastreams=store, pickup_timeout_s=30, **SETTINGS, **quick)
    first = make_queue(datastreams=store, **SETTINGS, **slow)
    # (the second beats soon: it holds the request while the test checks the store and reads
    # the stream, and its caller judges receivers silent after 1 s)
    second = make_queue(datastreams=store, **SETTINGS, **quick)
    data = os.urandom(100_000)
    request = Request(
        endpoint=ENDPOINT, method="m", params="p" * 10_000, delivery="at_least_once",
        streams={"f": DataStream.from_bytes(data)},
    )  # fmt: skip
    call = asyncio.ensure_future(sender.queue_and_wait(request, timeout_s=30))
    held = await first.dequeue(ENDPOINT, timeout_s=10)
    assert held is not None and held.delivery.attempt == 1
    files = stored(store)
    assert len(files) == 2  # (the body and the stream)

    # When the caller hands it out again to a second receiver, and the first one answers late
    again = await second.dequeue(ENDPOINT, timeout_s=10)
    assert again is not None and (again.id, again.delivery.attempt) == (request.id, 2)
    await first.apply_response(Response(id=held.id, result="first"))

    # Then that refused answer deleted nothing: the second receiver reads the stream whole
    assert stored(store) == files
    assert again.request.streams["f"].read() == data
    # And once the second receiver's answer is accepted, the request's data goes
    await second.apply_response(Response(id=again.id, result="second"))
    assert (await asyncio.wait_for(call, 10)).result == "second"
    assert stored(store) == []
