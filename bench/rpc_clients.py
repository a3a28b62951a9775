"""bench/rpc.py's calling side: each variant's client (raw list RPC or prq's call, asyncio or
threads) runs the warm-up, the sequential phase and the throughput phases against its server
process (`measure`).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable

import redis
import redis.asyncio

from bench.rpc_measures import Measured, Options, ServerCounters, _request_json
from bench.rpc_servers import ENDPOINT, SERVER_START_TIMEOUT_S, server_process
from prq import AsyncQueue, Queue

#: Bounds: one raw reply, one prq call, one whole phase.
REPLY_TIMEOUT_S = 10.0
CALL_TIMEOUT_S = 30.0
PHASE_TIMEOUT_S = 600.0


# -- asyncio clients -----------------------------------------------------------------------------


async def _run_async_phases(
    m: Measured,
    opts: Options,
    counters: ServerCounters,
    call: Callable[[int], Awaitable[None]],
    sender_commands: Callable[[], int],
) -> None:
    for i in range(opts.warmup):
        await call(i)
    before, sent = counters.snapshot(), sender_commands()
    for i in range(opts.seq_calls):
        started = time.perf_counter()
        await call(i)
        m.latencies_s.append(time.perf_counter() - started)
    middle = counters.snapshot()
    m.seq_sender_commands = sender_commands() - sent
    m.seq_server = counters.delta(before, middle)

    m.throughput_elapsed_s = await _async_throughput(call, opts.calls, opts.inflight)
    m.throughput_calls = opts.calls
    m.tput_server = counters.delta(middle, counters.snapshot())
    if opts.wide_inflight:
        m.wide_elapsed_s = await _async_throughput(call, opts.calls, opts.wide_inflight)
        m.wide_calls = opts.calls


async def _async_throughput(
    call: Callable[[int], Awaitable[None]], calls: int, inflight: int
) -> float:
    """Make `calls` calls with `inflight` of them in flight; the seconds it took."""
    numbers = iter(range(calls))

    async def worker() -> None:
        for i in numbers:  # one iterator shared by all workers: each call runs once
            await call(i)

    started = time.perf_counter()
    async with asyncio.timeout(PHASE_TIMEOUT_S):
        await asyncio.gather(*(worker() for _ in range(inflight)))
    return time.perf_counter() - started


async def _measure_raw_async(opts: Options, counters: ServerCounters) -> Measured:
    m = Measured("raw-async")
    client = redis.asyncio.Redis.from_url(
        opts.url, max_connections=max(opts.inflight, opts.wide_inflight) + 8
    )
    request_key = f"{opts.prefix}:raw:req"
    made = 0

    async def call(i: int) -> None:
        nonlocal made
        rid, body = _request_json(i)
        reply_key = f"{opts.prefix}:raw:reply:{rid}"
        made += 1
        await client.lpush(request_key, reply_key.encode() + b"|" + body)
        item = await client.blpop([reply_key], timeout=REPLY_TIMEOUT_S)
        if item is None:
            raise TimeoutError(f"no raw reply in {REPLY_TIMEOUT_S} s")
        if json.loads(item[1])["id"] != rid:
            raise AssertionError("raw reply for another request")

    try:
        await _run_async_phases(m, opts, counters, call, lambda: 2 * made)
    finally:
        await client.aclose()
    return m


async def _measure_prq_async(opts: Options, counters: ServerCounters) -> Measured:
    m = Measured("prq-async")
    async with AsyncQueue.from_url(opts.url, prefix=opts.prefix) as queue:

        async def call(i: int) -> None:
            result = await queue.call(
                ENDPOINT,
                "echo",
                {"i": i},
                pickup_timeout_s=CALL_TIMEOUT_S,
                timeout_s=CALL_TIMEOUT_S,
            )
            if result != {"i": i}:
                raise AssertionError(f"prq echo returned {result!r}")

        await _run_async_phases(m, opts, counters, call, lambda: queue.stats.redis_commands)
    return m


# -- blocking clients ----------------------------------------------------------------------------


def _run_sync_phases(
    m: Measured,
    opts: Options,
    counters: ServerCounters,
    call: Callable[[int], None],
    sender_commands: Callable[[], int],
) -> None:
    for i in range(opts.warmup):
        call(i)
    before, sent = counters.snapshot(), sender_commands()
    for i in range(opts.seq_calls):
        started = time.perf_counter()
        call(i)
        m.latencies_s.append(time.perf_counter() - started)
    middle = counters.snapshot()
    m.seq_sender_commands = sender_commands() - sent
    m.seq_server = counters.delta(before, middle)

    m.throughput_elapsed_s = _sync_throughput(call, opts.calls, opts.inflight)
    m.throughput_calls = opts.calls
    m.tput_server = counters.delta(middle, counters.snapshot())
    if opts.wide_inflight:
        m.wide_elapsed_s = _sync_throughput(call, opts.calls, opts.wide_inflight)
        m.wide_calls = opts.calls


def _sync_throughput(call: Callable[[int], None], calls: int, inflight: int) -> float:
    """Make `calls` calls from `inflight` threads; the seconds it took."""
    numbers = iter(range(calls))
    lock = threading.Lock()
    errors: list[BaseException] = []
    go = threading.Barrier(inflight + 1)

    def worker() -> None:
        go.wait(SERVER_START_TIMEOUT_S)
        while not errors:
            with lock:
                i = next(numbers, None)
            if i is None:
                return
            try:
                call(i)
            except BaseException as exc:
                errors.append(exc)
                return

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(inflight)]
    for thread in threads:
        thread.start()
    go.wait(SERVER_START_TIMEOUT_S)
    started = time.perf_counter()
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    if any(thread.is_alive() for thread in threads):
        raise TimeoutError(f"throughput phase did not finish in {PHASE_TIMEOUT_S} s")
    return elapsed


class _Counter:
    """A counter that threads can share."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def add(self, n: int) -> None:
        with self._lock:
            self.value += n


def _measure_raw_sync(opts: Options, counters: ServerCounters) -> Measured:
    m = Measured("raw-sync")
    pool = redis.ConnectionPool.from_url(
        opts.url, max_connections=max(opts.inflight, opts.wide_inflight) + 8
    )
    client = redis.Redis(connection_pool=pool)
    request_key = f"{opts.prefix}:raw:req"
    made = _Counter()

    def call(i: int) -> None:
        rid, body = _request_json(i)
        reply_key = f"{opts.prefix}:raw:reply:{rid}"
        made.add(2)  # LPUSH + BLPOP
        client.lpush(request_key, reply_key.encode() + b"|" + body)
        item = client.blpop([reply_key], timeout=REPLY_TIMEOUT_S)
        if item is None:
            raise TimeoutError(f"no raw reply in {REPLY_TIMEOUT_S} s")
        if json.loads(item[1])["id"] != rid:
            raise AssertionError("raw reply for another request")

    try:
        _run_sync_phases(m, opts, counters, call, lambda: made.value)
    finally:
        pool.disconnect()
    return m


def _measure_prq_sync(opts: Options, counters: ServerCounters) -> Measured:
    m = Measured("prq-sync")
    with Queue.from_url(opts.url, prefix=opts.prefix) as queue:

        def call(i: int) -> None:
            result = queue.call(
                ENDPOINT,
                "echo",
                {"i": i},
                pickup_timeout_s=CALL_TIMEOUT_S,
                timeout_s=CALL_TIMEOUT_S,
            )
            if result != {"i": i}:
                raise AssertionError(f"prq echo returned {result!r}")

        _run_sync_phases(m, opts, counters, call, lambda: queue.stats.redis_commands)
    return m


def measure(variant: str, opts: Options, counters: ServerCounters) -> Measured:
    """Start the variant's server process, run the phases, stop the server."""
    with server_process(variant, opts.url, opts.prefix, opts.inflight, counters.client) as pid:
        counters.server_pid = pid
        try:
            if variant == "raw-async":
                return asyncio.run(_measure_raw_async(opts, counters))
            if variant == "prq-async":
                return asyncio.run(_measure_prq_async(opts, counters))
            if variant == "raw-sync":
                return _measure_raw_sync(opts, counters)
            return _measure_prq_sync(opts, counters)
        finally:
            counters.server_pid = None
