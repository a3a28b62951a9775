"""Latency floor of a call's shape: how fast a sequential call could be, whatever the code.

prq's sequential call has a fixed shape (README, "How it works"): the sender's enqueue script
hands the request to a parked receiver and pulses its node; the receiver confirms the hand-off
with a second script and only then runs it; its answer script stores the response and pulses the
sender. This benchmark times that shape with the least code possible, beside the raw RPC of
`bench/rpc.py` and one other shape, in one run on one Redis, so that prq's p50 can be split into
what the shape costs and what prq's code costs on top of it:

    raw      LPUSH the request, BLPOP the reply; the server: BLPOP, LPUSH (bench/rpc.py's
             raw-async, the same server)
    prq      AsyncQueue.call against AsyncQueue.serve (bench/rpc.py's prq-async, the same
             server): the shape below with all of prq's code and guarantees around it
    pulse    prq's shape, minimal: an enqueue script (HSET, PEXPIRE, PUBLISH to the receiver's
             channel) → the receiver's confirming script (HGET state, HSET taken; returns the
             body) → an answer script (HSET, PUBLISH to the sender's channel)
    inbox    a shape whose hand-off needs no confirming round trip: the enqueue script pushes
             "id|body" to a list the parked receiver waits on with BLPOP (the pop is the
             confirmation: a request popped is taken, one left in the list can be taken back)
             → the same answer script

Both scripted shapes use redis.asyncio with hiredis, one process per side, like rpc.py's
raw-async; nothing of prq runs in them. Sequential calls only (p50 and p99 over --calls, after
--warmup); every process paces the garbage collector as `prq worker` does.

    python bench/shape.py [--calls 2000] [--repeat 3] [--url redis://...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis
import redis.asyncio
from rich.console import Console
from rich.table import Table

from bench.rpc import _cleanup
from bench.rpc_clients import CALL_TIMEOUT_S, REPLY_TIMEOUT_S
from bench.rpc_measures import _request_json, percentile
from bench.rpc_servers import ENDPOINT, SERVER_START_TIMEOUT_S, server_process
from prq import AsyncQueue
from prq.embedded import redis_url_or_embedded
from prq.serve.collector import relax_collector

SHAPES = ("raw", "prq", "pulse", "inbox")
STOP = "__stop__"

#: The sender's enqueue: the record (state, body, sender), its TTL, then the hand-off signal.
ENQUEUE_PULSE = """redis.call('HSET', KEYS[1], 'st', 'handed', 'b', ARGV[1], 'snd', ARGV[2])
redis.call('PEXPIRE', KEYS[1], 60000)
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1"""
ENQUEUE_INBOX = """redis.call('HSET', KEYS[1], 'st', 'handed', 'b', ARGV[1], 'snd', ARGV[2])
redis.call('PEXPIRE', KEYS[1], 60000)
redis.call('LPUSH', KEYS[2], ARGV[4] .. '|' .. ARGV[1])
return 1"""
#: The receiver's confirmation: handed becomes taken (the pickup), the body comes back.
CONFIRM = """if redis.call('HGET', KEYS[1], 'st') ~= 'handed' then return false end
redis.call('HSET', KEYS[1], 'st', 'taken')
return redis.call('HGET', KEYS[1], 'b')"""
#: The answer: the response stored, the sender pulsed with it.
ANSWER = """redis.call('HSET', KEYS[1], 'st', 'done', 'rsp', ARGV[1])
redis.call('PUBLISH', ARGV[2], ARGV[3] .. '|' .. ARGV[1])
return 1"""


def _echo(body: bytes) -> str:
    return json.dumps({"result": json.loads(body)})


async def _next_message(pubsub: Any) -> bytes:
    """The next message on a subscribed connection (bounded wait)."""
    async with asyncio.timeout(REPLY_TIMEOUT_S):
        while True:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            if message is not None:
                return bytes(message["data"])


async def _receiver(shape: str, url: str, prefix: str, ready_key: str) -> None:
    client = redis.asyncio.Redis.from_url(url)
    answer = client.register_script(ANSWER)
    sender_channel = f"{prefix}:node:sender"
    try:
        if shape == "pulse":
            confirm = client.register_script(CONFIRM)
            pubsub = client.pubsub()
            await pubsub.subscribe(f"{prefix}:node:receiver")
            await client.lpush(ready_key, b"ready")
            while True:
                rid = (await _next_message(pubsub)).decode()
                if rid == STOP:
                    return
                key = f"{prefix}:r:{rid}"
                body = await confirm(keys=[key])
                if body is not None:
                    await answer(keys=[key], args=[_echo(body), sender_channel, rid])
        else:
            await client.lpush(ready_key, b"ready")
            while True:
                item = await client.blpop([f"{prefix}:inbox"], timeout=REPLY_TIMEOUT_S)
                if item is None:
                    continue
                raw = item[1]
                text = raw.decode() if isinstance(raw, bytes) else raw
                rid, _, body = text.partition("|")
                if rid == STOP:
                    return
                key = f"{prefix}:r:{rid}"
                await answer(keys=[key], args=[_echo(body.encode()), sender_channel, rid])
    finally:
        await client.aclose()


def receiver_main(shape: str, url: str, prefix: str, ready_key: str) -> None:
    """Entry point of a scripted shape's receiver process."""
    relax_collector()
    asyncio.run(_receiver(shape, url, prefix, ready_key))


async def _timed(call: Callable[[int], Awaitable[None]], warmup: int, calls: int) -> list[float]:
    for i in range(warmup):
        await call(i)
    latencies: list[float] = []
    for i in range(calls):
        started = time.perf_counter()
        await call(i)
        latencies.append(time.perf_counter() - started)
    return sorted(latencies)


async def _raw_calls(url: str, prefix: str, warmup: int, calls: int) -> list[float]:
    client = redis.asyncio.Redis.from_url(url)

    async def call(i: int) -> None:
        rid, body = _request_json(i)
        reply_key = f"{prefix}:raw:reply:{rid}"
        await client.lpush(f"{prefix}:raw:req", reply_key.encode() + b"|" + body)
        if await client.blpop([reply_key], timeout=REPLY_TIMEOUT_S) is None:
            raise TimeoutError(f"no raw reply in {REPLY_TIMEOUT_S} s")

    try:
        return await _timed(call, warmup, calls)
    finally:
        await client.aclose()


async def _prq_calls(url: str, prefix: str, warmup: int, calls: int) -> list[float]:
    async with AsyncQueue.from_url(url, prefix=prefix) as queue:

        async def call(i: int) -> None:
            if await queue.call(ENDPOINT, "echo", {"i": i}, timeout_s=CALL_TIMEOUT_S) != {"i": i}:
                raise AssertionError("an answer for another request")

        return await _timed(call, warmup, calls)


async def _scripted_calls(
    shape: str, url: str, prefix: str, warmup: int, calls: int
) -> list[float]:
    client = redis.asyncio.Redis.from_url(url)
    enqueue = client.register_script(ENQUEUE_PULSE if shape == "pulse" else ENQUEUE_INBOX)
    pubsub = client.pubsub()
    await pubsub.subscribe(f"{prefix}:node:sender")
    receiver_channel, inbox = f"{prefix}:node:receiver", f"{prefix}:inbox"

    async def call(i: int) -> None:
        rid = uuid.uuid4().hex
        body = json.dumps({"i": i})
        await enqueue(
            keys=[f"{prefix}:r:{rid}", inbox], args=[body, "sender", receiver_channel, rid]
        )
        if not (await _next_message(pubsub)).startswith(rid.encode()):
            raise AssertionError("an answer for another request")

    try:
        return await _timed(call, warmup, calls)
    finally:
        if shape == "pulse":
            await client.publish(receiver_channel, STOP)
        else:
            await client.lpush(inbox, STOP)
        await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]
        await client.aclose()


def measure(shape: str, url: str, warmup: int, calls: int) -> list[float]:
    """Sorted latencies (s) of `calls` sequential calls of `shape`, its server in a process."""
    prefix = f"bench-shape-{uuid.uuid4().hex[:8]}"
    control = redis.Redis.from_url(url)
    try:
        if shape == "raw":
            with server_process("raw-async", url, prefix, 1, control):
                return asyncio.run(_raw_calls(url, prefix, warmup, calls))
        if shape == "prq":
            with server_process("prq-async", url, prefix, 1, control):
                return asyncio.run(_prq_calls(url, prefix, warmup, calls))
        ready_key = f"{prefix}:ready"
        ctx = multiprocessing.get_context("spawn")
        process = ctx.Process(target=receiver_main, args=(shape, url, prefix, ready_key))
        process.start()
        try:
            # (short waits: one as long as the start may take outlasts the client's socket
            # timeout on a loaded host)
            started = time.monotonic()
            while control.blpop([ready_key], timeout=1) is None:
                if time.monotonic() - started > SERVER_START_TIMEOUT_S:
                    raise RuntimeError(f"{shape} receiver not ready in {SERVER_START_TIMEOUT_S} s")
            return asyncio.run(_scripted_calls(shape, url, prefix, warmup, calls))
        finally:
            process.join(SERVER_START_TIMEOUT_S)
            if process.is_alive():
                process.kill()
                process.join(SERVER_START_TIMEOUT_S)
    finally:
        _cleanup(control, prefix)
        control.close()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", help="Redis URL (default: PRQ_REDIS_URL, else embedded)")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=1, help="rounds, interleaved (medians)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    relax_collector()  # as every process of bench/rpc.py does
    console = Console(width=120)
    runs: dict[str, list[list[float]]] = {shape: [] for shape in SHAPES}
    with redis_url_or_embedded(args.url) as url:
        for round_ in range(args.repeat):
            for shape in SHAPES:
                console.print(f"{shape}: round {round_ + 1}/{args.repeat} ...")
                runs[shape].append(measure(shape, url, args.warmup, args.calls))

    def median_ms(shape: str, q: float) -> float:
        return statistics.median(percentile(run, q) for run in runs[shape]) * 1000

    base = median_ms("raw", 0.5)
    table = Table(title=f"sequential calls ({args.calls}, median of {args.repeat} rounds)")
    for header in ("shape", "p50 ms", "p99 ms", "p50 / raw"):
        table.add_column(header, justify="left" if header == "shape" else "right")
    for shape in SHAPES:
        p50 = median_ms(shape, 0.5)
        ratio = "-" if shape == "raw" else f"{p50 / base:.2f}x"
        table.add_row(shape, f"{p50:.3f}", f"{median_ms(shape, 0.99):.3f}", ratio)
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
