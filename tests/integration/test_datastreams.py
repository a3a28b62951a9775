"""DataStreams beside Redis (prq.datastreams) on real Redis and a real shared directory.

Redis keeps only each stream's reference; the data goes through the directory, chunk by chunk,
and is deleted once used. A 256 MiB stream round-trips with the node's Python memory growing
by a few MiB (tracemalloc's peak, printed).
"""

from __future__ import annotations

import asyncio
import os
import time
import tracemalloc
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis

from prq import ConfigurationError, Request, Response, SerializationError
from prq.core.keys import KeySchema
from prq.datastreams import DataStream, FileSystemStore
from tests.queue_facades import QueueFactory, run_all
from tests.redis_servers import async_wait_until
from tests.stored_bodies import read_body

pytestmark = pytest.mark.integration

ENDPOINT = "poll://streams"
MIB = 1024 * 1024


def stored_files(store: FileSystemStore) -> list[str]:
    return sorted(name for name in os.listdir(store.directory) if not name.startswith("."))


async def test_streams_go_both_ways_beside_redis_and_are_deleted_after_use(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str, tmp_path: Path
) -> None:
    # Given two nodes sharing a stream directory, and 3 MiB of data
    store = FileSystemStore(tmp_path / "streams")
    caller, receiver = make_queue(datastreams=store), make_queue(datastreams=store)
    data = os.urandom(3 * MIB + 17)
    request = Request(
        endpoint=ENDPOINT, method="reverse", streams={"file": DataStream.from_bytes(data)}
    )

    async def serve() -> int:
        pending = await receiver.dequeue(ENDPOINT, timeout_s=10)
        assert pending is not None
        # (Redis holds the reference only: the stored body is small)
        body = read_body(redis_client, KeySchema(key_prefix).endpoint(ENDPOINT).request(pending.id))
        assert isinstance(body, bytes) and len(body) < 1024
        stream = pending.request.streams["file"]
        got = stream.read()
        reply = DataStream.from_bytes(got[::-1])
        await receiver.apply_response(
            Response(id=pending.id, result={"length": len(got)}, streams={"back": reply})
        )
        return len(stored_files(store))

    # When the receiver reads it and answers with a stream of its own
    response, files_after_answer = await run_all(
        [caller.queue_and_wait(request, timeout_s=20), serve()], 30
    )

    # Then both got the exact bytes, and the request's data was deleted once answered
    assert response.result == {"length": len(data)}
    assert files_after_answer == 1  # (only the response's stream is left)
    back = response.streams["back"]
    assert back.length == len(data)
    assert back.read() == data[::-1]
    # And the response's data is deleted once the caller read it
    assert stored_files(store) == []
    # And a stream is read once
    with pytest.raises(SerializationError, match="read once"):
        back.open()


async def test_streams_need_a_store_on_both_sides(make_queue: QueueFactory, tmp_path: Path) -> None:
    # A node without a store refuses to send a stream, before anything is written
    bare = make_queue()
    request = Request(endpoint=ENDPOINT, method="m", streams={"f": DataStream.from_bytes(b"x")})
    with pytest.raises(ConfigurationError, match="DataStreamStore"):
        await bare.queue_and_wait(request, timeout_s=5)
    # A receiver without one gets the request, but cannot read its stream: it says why
    sender = make_queue(datastreams=FileSystemStore(tmp_path / "s"))
    call = asyncio.ensure_future(sender.queue_and_wait(request, timeout_s=10))
    pending = await bare.dequeue(ENDPOINT, timeout_s=10)
    assert pending is not None
    with pytest.raises(SerializationError, match="not bound to a store"):
        pending.request.streams["f"].open()
    await bare.apply_response(Response(id=pending.id, result="no store"))
    assert (await asyncio.wait_for(call, 10)).result == "no store"


async def test_expired_streams_are_swept_by_the_nodes(
    make_queue: QueueFactory, tmp_path: Path
) -> None:
    # Given a stream left behind (its caller never read it) and one still live
    store = FileSystemStore(tmp_path / "streams")
    now_ms = int(time.time() * 1000)
    store.store("a" * 32, [b"left behind"], now_ms - 1)
    live = store.store("b" * 32, [b"live"], now_ms + 3_600_000)
    # When a node using the directory runs its checks
    node = make_queue(datastreams=store, data_loss_check_interval_s=0.2)
    await node.start()
    # Then the expired one is removed, and the live one kept
    await async_wait_until(
        lambda: stored_files(store) == [live], 10, 0.05, "the expired stream swept"
    )


@pytest.mark.parametrize("facade", ["async"], indirect=True)
@pytest.mark.timeout(120)
async def test_a_256_mib_stream_round_trips_in_bounded_memory(
    make_queue: QueueFactory, tmp_path: Path
) -> None:
    # Given a 256 MiB file, and two nodes sharing a stream directory
    size = 256 * MIB
    source, copy = tmp_path / "big.bin", tmp_path / "copy.bin"
    block = os.urandom(MIB)
    with source.open("wb") as out:
        for _ in range(size // MIB):
            out.write(block)
    store = FileSystemStore(tmp_path / "streams")
    caller, receiver = make_queue(datastreams=store), make_queue(datastreams=store)
    await caller.start()
    await receiver.start()
    request = Request(
        endpoint=ENDPOINT, method="save", streams={"big": DataStream.from_path(source)}
    )

    async def serve() -> None:
        pending = await receiver.dequeue(ENDPOINT, timeout_s=60)
        assert pending is not None
        written = await asyncio.to_thread(pending.request.streams["big"].save, copy)
        await receiver.apply_response(Response(id=pending.id, result=written))

    # When it is sent, read by the receiver into another file, and answered
    tracemalloc.start()
    try:
        response, _ = await run_all([caller.queue_and_wait(request, timeout_s=90), serve()], 100)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    # Then every byte arrived, and the peak Python memory of both nodes together stayed a
    # small fraction of the payload
    assert response.result == size
    assert copy.stat().st_size == size
    with source.open("rb") as a, copy.open("rb") as b:
        while chunk := a.read(8 * MIB):
            assert chunk == b.read(8 * MIB)
    print(f"[datastreams] payload={size / MIB:.0f} MiB peak_python_memory={peak / MIB:.1f} MiB")
    assert peak < size / 16
    assert stored_files(store) == []


def test_the_file_store_opens_only_its_own_references(tmp_path: Path) -> None:
    store = FileSystemStore(tmp_path / "streams")
    (tmp_path / "secret").write_text("not yours")
    for forged in ("../secret", "/etc/passwd", "1-" + "a" * 31, "x" * 600, "12-" + "A" * 32):
        with pytest.raises(SerializationError, match="not a reference of this store"):
            store.rehydrate(forged)
        with pytest.raises(SerializationError):
            store.delete(forged)
        with pytest.raises(SerializationError):
            store.extend(forged, 0)
    with pytest.raises(SerializationError, match="is not in"):
        store.rehydrate("1-" + "a" * 32)


async def test_the_sender_sees_the_receivers_progress_through_heartbeats(
    make_queue: QueueFactory, tmp_path: Path
) -> None:
    # Given fast heartbeats, and a 4 MiB stream
    beats: dict[str, Any] = {"heartbeat_interval_s": 0.1, "heartbeat_initial_delay_s": 0.05}
    store = FileSystemStore(tmp_path / "streams")
    caller = make_queue(datastreams=store, **beats)
    receiver = make_queue(datastreams=store, **beats)
    size = 4 * MIB
    request = Request(
        endpoint=ENDPOINT, method="m", streams={"f": DataStream.from_bytes(os.urandom(size))}
    )
    seen: list[tuple[int, int]] = []

    def heard(done: int) -> bool:
        return bool(seen) and seen[-1][0] >= done

    async def serve() -> None:
        pending = await receiver.dequeue(ENDPOINT, timeout_s=10)
        assert pending is not None
        stream = pending.request.streams["f"]
        # When the receiver reads it a MiB at a time, each time until the sender heard of it
        with stream.open() as data:
            while chunk := data.read(MIB):
                done = stream.bytes_read
                await async_wait_until(
                    partial(heard, done), 10, 0.01, f"the sender told of {done} bytes read"
                )
                assert len(chunk) == MIB
        await receiver.apply_response(Response(id=pending.id, result="read"))

    response, _ = await run_all(
        [caller.queue_and_wait(request, timeout_s=30, on_progress=lambda *p: seen.append(p)),
         serve()],
        40,
    )  # fmt: skip

    # Then it heard every step, in order, against the stream's whole length
    assert response.result == "read"
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    assert {total for _, total in seen} == {size}
    assert {MIB, 2 * MIB, 3 * MIB, 4 * MIB} <= {done for done, _ in seen}
