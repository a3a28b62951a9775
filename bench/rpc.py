"""RPC round-trip benchmark: prq against a raw redis-py list RPC, on one Redis, in one run.

Variants (the client runs here; the server is its own OS process, spawned):

    raw-async  redis.asyncio: LPUSH request, BLPOP reply   ⇄  asyncio server, K tasks:
                                                               BLPOP request → LPUSH reply
    raw-sync   redis (blocking) in threads: same commands  ⇄  threaded server, K threads: same
    prq-async  AsyncQueue.call                             ⇄  AsyncQueue.serve(echo, concurrency=K)
    prq-sync   Queue.call in threads                       ⇄  Queue.serve(echo, concurrency=K)

K = --inflight. Every server process, and this client, paces the garbage collector as
`prq worker` does (prq.serve.collector). Both raw sides JSON-decode and JSON-encode the message, as
any RPC would; hiredis parses replies (redis[hiredis]). Each variant runs: warm-up (--warmup
sequential calls), the sequential phase (--seq-calls, one at a time: p50 and p99) and the
throughput phase (--calls with --inflight calls in flight: calls/s; threads for the sync variants).

Commands per call:
    sender  commands the calling node sent: `queue.stats.redis_commands` for prq (pipelined
            commands count one each), LPUSH + BLPOP = 2 for raw.
    server  delta of `INFO stats total_commands_processed` over the phase, divided by its calls:
            every command Redis executed for anyone (sender and server process), including
            commands run inside Lua scripts (Redis 7 counts those too), excluding the INFO probes
            themselves. The per-command breakdown (of each phase) comes from
            `INFO commandstats`. PUBLISH inside a script counts; delivering a pub/sub message
            does not.

A second throughput phase runs with --wide-inflight calls in flight (256; the servers keep K
workers): calls/s only.

Targets (printed as PASS/MISS, never asserted): prq p50 <= 2.0x its raw twin's p50, prq
throughput (@K) >= 1.0x its raw twin's, Redis commands per call (@K, inside scripts included)
<= 12, and Redis CPU per call (@K) <= the raw twin's. Run `python bench/rpc.py --help`, or
`prq bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import multiprocessing
import multiprocessing.synchronize
import os
import platform
import signal
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio
from redis.utils import HIREDIS_AVAILABLE
from rich.console import Console
from rich.table import Table

from prq import AsyncQueue, Queue, Request
from prq.embedded import EmbeddedRedis
from prq.serve.collector import relax_collector

logger = logging.getLogger(__name__)

#: Every variant, in the order they run; a prq variant is compared with the raw one of its facade.
VARIANTS = ("raw-async", "raw-sync", "prq-async", "prq-sync")
BASELINE_OF = {"prq-async": "raw-async", "prq-sync": "raw-sync"}
#: Targets: prq p50 at most this many times the baseline's; throughput at least this share;
#: Redis commands per call (those inside scripts included) at most this many, and Redis CPU
#: per call at most the baseline's (in the throughput phase).
TARGET_P50_RATIO = 2.0
TARGET_THROUGHPUT_RATIO = 1.0
TARGET_COMMANDS_PER_CALL = 12
TARGET_REDIS_CPU_RATIO = 1.0
#: The endpoint the prq server process serves.
ENDPOINT = "poll://bench-echo"
#: What tells a raw server worker to exit.
STOP = b"__stop__"
#: Bounds: server start-up, server stop, one raw reply, one prq call, one whole phase.
SERVER_START_TIMEOUT_S = 30.0
SERVER_STOP_TIMEOUT_S = 10.0
REPLY_TIMEOUT_S = 10.0
CALL_TIMEOUT_S = 30.0
PHASE_TIMEOUT_S = 600.0


# -- servers (each runs in its own spawned process) ----------------------------------------------


def _echo_raw(message: bytes | str) -> tuple[bytes, bytes]:
    """Split `reply key|request JSON`; return the reply key and the reply JSON."""
    if isinstance(message, str):
        message = message.encode()
    reply_key, _, body = message.partition(b"|")
    request = json.loads(body)
    reply = json.dumps({"id": request["id"], "result": request["params"]}).encode()
    return reply_key, reply


async def _raw_server_async(url: str, request_key: str, ready_key: str, workers: int) -> None:
    client = redis.asyncio.Redis.from_url(url, max_connections=workers + 2)

    async def work() -> None:
        while True:
            item = await client.blpop([request_key], timeout=30)
            if item is None:
                continue
            if item[1] == STOP:
                return
            reply_key, reply = _echo_raw(item[1])
            await client.lpush(reply_key, reply)

    tasks = [asyncio.create_task(work()) for _ in range(workers)]
    await client.lpush(ready_key, b"ready")
    await asyncio.gather(*tasks)
    await client.aclose()


def _raw_server_sync(url: str, request_key: str, ready_key: str, workers: int) -> None:
    pool = redis.ConnectionPool.from_url(url, max_connections=workers + 2)
    client = redis.Redis(connection_pool=pool)

    def work() -> None:
        while True:
            item = client.blpop([request_key], timeout=30)
            if item is None:
                continue
            if item[1] == STOP:
                return
            reply_key, reply = _echo_raw(item[1])
            client.lpush(reply_key, reply)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(workers)]
    for thread in threads:
        thread.start()
    client.lpush(ready_key, b"ready")
    for thread in threads:
        thread.join()
    pool.disconnect()


async def _prq_server_async(
    url: str, prefix: str, ready_key: str, workers: int, stop: multiprocessing.synchronize.Event
) -> None:
    async def echo(request: Request) -> Any:
        return request.params

    async with AsyncQueue.from_url(url, prefix=prefix) as queue:
        stop_serving = asyncio.Event()
        server = asyncio.create_task(
            queue.serve(ENDPOINT, echo, concurrency=workers, stop=stop_serving)
        )
        ready = redis.asyncio.Redis.from_url(url)
        await ready.lpush(ready_key, b"ready")
        await ready.aclose()
        while not stop.is_set() and not server.done():
            await asyncio.sleep(0.1)
        stop_serving.set()
        await asyncio.wait([server], timeout=SERVER_STOP_TIMEOUT_S / 2)


def _prq_server_sync(
    url: str, prefix: str, ready_key: str, workers: int, stop: multiprocessing.synchronize.Event
) -> None:
    def echo(request: Request) -> Any:
        return request.params

    with Queue.from_url(url, prefix=prefix) as queue:
        stop_serving = threading.Event()
        server = threading.Thread(
            target=queue.serve,
            args=(ENDPOINT, echo),
            kwargs={"concurrency": workers, "stop": stop_serving},
            daemon=True,
        )
        server.start()
        redis.Redis.from_url(url).lpush(ready_key, b"ready")
        while not stop.wait(0.1) and server.is_alive():
            pass
        stop_serving.set()
        server.join(SERVER_STOP_TIMEOUT_S / 2)


def server_main(
    variant: str,
    url: str,
    prefix: str,
    ready_key: str,
    workers: int,
    stop: multiprocessing.synchronize.Event,
) -> None:
    """Entry point of a server process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    relax_collector()  # as `prq worker` does; the same for every variant
    request_key = f"{prefix}:raw:req"
    if variant == "raw-async":
        asyncio.run(_raw_server_async(url, request_key, ready_key, workers))
    elif variant == "raw-sync":
        _raw_server_sync(url, request_key, ready_key, workers)
    elif variant == "prq-async":
        asyncio.run(_prq_server_async(url, prefix, ready_key, workers, stop))
    elif variant == "prq-sync":
        _prq_server_sync(url, prefix, ready_key, workers, stop)
    else:
        raise ValueError(f"unknown variant {variant!r}")


@contextlib.contextmanager
def server_process(
    variant: str, url: str, prefix: str, workers: int, control: redis.Redis
) -> Iterator[int]:
    """Run the variant's server process for the duration of the block (bounded start and stop)."""
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    ready_key = f"{prefix}:ready:{variant}"
    process = ctx.Process(
        target=server_main,
        args=(variant, url, prefix, ready_key, workers, stop),
        name=f"bench-server-{variant}",
        daemon=True,
    )
    process.start()
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while control.blpop([ready_key], timeout=1) is None:
            if process.exitcode is not None:
                raise RuntimeError(f"{variant} server exited with {process.exitcode} at start")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{variant} server not ready in {SERVER_START_TIMEOUT_S} s")
        assert process.pid is not None
        yield process.pid
    finally:
        stop.set()
        if variant.startswith("raw-"):
            control.rpush(f"{prefix}:raw:req", *([STOP] * workers))
        process.join(SERVER_STOP_TIMEOUT_S)
        if process.is_alive():
            logger.warning("%s server did not stop in time; terminating", variant)
            process.terminate()
            process.join(2.0)
        if process.is_alive():
            process.kill()
            process.join(2.0)


# -- measuring -----------------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted sequence."""
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system, all threads) used so far by process `pid`; None off Linux."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return None
    # After the command name: state is field 3, utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class ServerSnapshot:
    """Redis's counters, and the CPU time used by Redis, this process and the server process."""

    commands: int
    per_command: dict[str, int]
    redis_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    server_cpu_s: float | None = None


class ServerCounters:
    """Reads Redis's own counters; `delta` removes the INFO probes that reading them costs."""

    #: A snapshot sends INFO stats, INFO commandstats and INFO cpu; a delta covers three.
    PROBE_COMMANDS = 3

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        #: The running server process, whose CPU time snapshots include.
        self.server_pid: int | None = None

    def snapshot(self) -> ServerSnapshot:
        stats = self.client.info("stats")
        commandstats = self.client.info("commandstats")
        cpu = self.client.info("cpu")
        per_command = {
            name.removeprefix("cmdstat_"): int(value["calls"])
            for name, value in commandstats.items()
            if isinstance(value, dict)
        }
        return ServerSnapshot(
            int(stats["total_commands_processed"]),
            per_command,
            redis_cpu_s=float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
            client_cpu_s=time.process_time(),
            server_cpu_s=None if self.server_pid is None else process_cpu_s(self.server_pid),
        )

    def delta(self, before: ServerSnapshot, after: ServerSnapshot) -> ServerSnapshot:
        per_command = {
            name: calls - before.per_command.get(name, 0)
            for name, calls in after.per_command.items()
            if name != "info" and calls != before.per_command.get(name, 0)
        }
        server_cpu = None
        if before.server_cpu_s is not None and after.server_cpu_s is not None:
            server_cpu = after.server_cpu_s - before.server_cpu_s
        return ServerSnapshot(
            after.commands - before.commands - self.PROBE_COMMANDS,
            per_command,
            redis_cpu_s=after.redis_cpu_s - before.redis_cpu_s,
            client_cpu_s=after.client_cpu_s - before.client_cpu_s,
            server_cpu_s=server_cpu,
        )


@dataclass
class Measured:
    """What the phases of one variant produced."""

    variant: str
    latencies_s: list[float] = field(default_factory=list)
    throughput_elapsed_s: float = 0.0
    throughput_calls: int = 0
    seq_sender_commands: int = 0
    seq_server: ServerSnapshot | None = None
    tput_server: ServerSnapshot | None = None
    wide_elapsed_s: float = 0.0
    wide_calls: int = 0

    @property
    def p50_ms(self) -> float:
        return percentile(sorted(self.latencies_s), 0.50) * 1000

    @property
    def p99_ms(self) -> float:
        return percentile(sorted(self.latencies_s), 0.99) * 1000

    @property
    def calls_per_s(self) -> float:
        return self.throughput_calls / self.throughput_elapsed_s

    @property
    def wide_calls_per_s(self) -> float:
        return self.wide_calls / self.wide_elapsed_s if self.wide_elapsed_s else 0.0

    @property
    def sender_per_call(self) -> float:
        return self.seq_sender_commands / len(self.latencies_s)

    def _phase(self, phase: str) -> tuple[ServerSnapshot, int]:
        snap = self.seq_server if phase == "seq" else self.tput_server
        calls = len(self.latencies_s) if phase == "seq" else self.throughput_calls
        assert snap is not None
        return snap, calls

    def server_per_call(self, phase: str) -> float:
        snap, calls = self._phase(phase)
        return snap.commands / calls

    def cpu_us_per_call(self, phase: str) -> tuple[float, float | None, float]:
        """CPU microseconds per call: (sender process, server process, Redis)."""
        snap, calls = self._phase(phase)
        server = None if snap.server_cpu_s is None else snap.server_cpu_s * 1e6 / calls
        return snap.client_cpu_s * 1e6 / calls, server, snap.redis_cpu_s * 1e6 / calls


class Summary:
    """One variant over its repeats: the median of each metric (the first run's breakdown)."""

    def __init__(self, runs: Sequence[Measured]) -> None:
        self.runs = list(runs)
        self.first = self.runs[0]

    def _median(self, metric: Callable[[Measured], float]) -> float:
        return statistics.median(metric(run) for run in self.runs)

    @property
    def p50_ms(self) -> float:
        return self._median(lambda run: run.p50_ms)

    @property
    def p99_ms(self) -> float:
        return self._median(lambda run: run.p99_ms)

    @property
    def calls_per_s(self) -> float:
        return self._median(lambda run: run.calls_per_s)

    @property
    def wide_calls_per_s(self) -> float:
        return self._median(lambda run: run.wide_calls_per_s)

    @property
    def sender_per_call(self) -> float:
        return self._median(lambda run: run.sender_per_call)

    def server_per_call(self, phase: str) -> float:
        return self._median(lambda run: run.server_per_call(phase))

    def cpu_us_per_call(self, phase: str) -> tuple[float, float | None, float]:
        per_run = [run.cpu_us_per_call(phase) for run in self.runs]
        servers = [server for _, server, _ in per_run if server is not None]
        return (
            statistics.median(sender for sender, _, _ in per_run),
            statistics.median(servers) if len(servers) == len(per_run) else None,
            statistics.median(redis_cpu for _, _, redis_cpu in per_run),
        )


@dataclass(frozen=True, slots=True)
class Options:
    url: str
    calls: int
    seq_calls: int
    warmup: int
    inflight: int
    variants: tuple[str, ...]
    markdown: bool
    prefix: str
    repeat: int = 1
    #: Calls in flight in the second throughput phase (0: none).
    wide_inflight: int = 256


def _request_json(i: int) -> tuple[str, bytes]:
    rid = uuid.uuid4().hex
    return rid, json.dumps({"id": rid, "method": "echo", "params": {"i": i}}).encode()


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


# -- reporting -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Row:
    variant: str
    cells: tuple[str, ...]


HEADERS = (
    "variant",
    "p50 ms",
    "p99 ms",
    "calls/s @{inflight}",
    "sender cmds/call",
    "server cmds/call (seq)",
    "server cmds/call (@{inflight})",
    "p50 / baseline",
    "calls/s / baseline",
    "calls/s @{wide}",
    "@{wide} / baseline",
)


def build_rows(results: dict[str, Summary]) -> list[Row]:
    rows = []
    for variant, m in results.items():
        base = results.get(BASELINE_OF.get(variant, ""))
        p50_ratio = f"{m.p50_ms / base.p50_ms:.2f}x" if base else "-"
        tput_ratio = f"{m.calls_per_s / base.calls_per_s:.2f}x" if base else "-"
        wide = m.wide_calls_per_s
        wide_ratio = f"{wide / base.wide_calls_per_s:.2f}x" if base and wide else "-"
        rows.append(
            Row(
                variant,
                (
                    variant,
                    f"{m.p50_ms:.3f}",
                    f"{m.p99_ms:.3f}",
                    f"{m.calls_per_s:,.0f}",
                    f"{m.sender_per_call:.2f}",
                    f"{m.server_per_call('seq'):.2f}",
                    f"{m.server_per_call('tput'):.2f}",
                    p50_ratio,
                    tput_ratio,
                    f"{wide:,.0f}" if wide else "-",
                    wide_ratio,
                ),
            )
        )
    return rows


def target_lines(results: dict[str, Summary]) -> list[str]:
    lines = []
    for variant, baseline in BASELINE_OF.items():
        m, base = results.get(variant), results.get(baseline)
        if m is None or base is None:
            continue
        p50_ratio = m.p50_ms / base.p50_ms
        tput_ratio = m.calls_per_s / base.calls_per_s
        commands = m.server_per_call("tput")
        redis_ratio = m.cpu_us_per_call("tput")[2] / base.cpu_us_per_call("tput")[2]
        checks = (
            (f"p50 {p50_ratio:.2f}x", f"<= {TARGET_P50_RATIO}x", p50_ratio <= TARGET_P50_RATIO),
            (
                f"throughput {tput_ratio:.2f}x",
                f">= {TARGET_THROUGHPUT_RATIO}x",
                tput_ratio >= TARGET_THROUGHPUT_RATIO,
            ),
            (
                f"Redis commands per call {commands:.1f}",
                f"<= {TARGET_COMMANDS_PER_CALL}",
                commands <= TARGET_COMMANDS_PER_CALL,
            ),
            (
                f"Redis CPU per call {redis_ratio:.2f}x",
                f"<= {TARGET_REDIS_CPU_RATIO}x",
                redis_ratio <= TARGET_REDIS_CPU_RATIO,
            ),
        )
        lines.append(
            f"{variant} vs {baseline}: "
            + "; ".join(
                f"{what} (target {target}) {'PASS' if ok else 'MISS'}"
                for what, target, ok in checks
            )
        )
    return lines


#: The phases whose per-command breakdown is printed, with their titles.
PHASES = (("seq", "sequential phase"), ("tput", "throughput phase"))


def breakdown_lines(results: dict[str, Summary], phase: str = "seq") -> list[str]:
    """Per-command calls per call in one phase ("seq" or "tput"; INFO commandstats)."""
    lines = []
    for variant, summary in results.items():
        snap, calls = summary.first._phase(phase)
        parts = sorted(snap.per_command.items(), key=lambda kv: (-kv[1], kv[0]))
        # Connection set-up (HELLO, CLIENT SETINFO) and probes are not per-call work.
        text = ", ".join(
            f"{name} {count / calls:.2f}" for name, count in parts if count >= calls / 200
        )
        lines.append(f"{variant}: {text}")
    return lines


CPU_HEADERS = (
    "variant",
    "sender µs (seq)",
    "receiver µs (seq)",
    "redis µs (seq)",
    "sender µs (@{inflight})",
    "receiver µs (@{inflight})",
    "redis µs (@{inflight})",
)


def cpu_rows(results: dict[str, Summary]) -> list[Row]:
    """CPU time per call of each process: where the time goes (user + system)."""

    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    rows = []
    for variant, m in results.items():
        seq, tput = m.cpu_us_per_call("seq"), m.cpu_us_per_call("tput")
        rows.append(Row(variant, (variant, *map(fmt, seq), *map(fmt, tput))))
    return rows


def environment_line(client: redis.Redis, opts: Options) -> str:
    server = client.info("server")
    return (
        f"redis {server.get('redis_version', '?')} · redis-py {redis.__version__} · "
        f"hiredis {'yes' if HIREDIS_AVAILABLE else 'no'} · Python {platform.python_version()} · "
        f"{os.cpu_count()} CPUs (load {os.getloadavg()[0]:.1f} at the end) · "
        f"warm-up {opts.warmup}, sequential {opts.seq_calls}, "
        f"throughput {opts.calls} calls with {opts.inflight} in flight"
        + (f" (and with {opts.wide_inflight})" if opts.wide_inflight else "")
        + (f" · median of {opts.repeat} interleaved runs" if opts.repeat > 1 else "")
    )


def _markdown_table(headers: Sequence[str], rows: Sequence[Row]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |"]
    lines.append("|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|")
    lines.extend("| " + " | ".join(row.cells) + " |" for row in rows)
    return lines


def _rich_table(title: str, headers: Sequence[str], rows: Sequence[Row], caption: str) -> Table:
    table = Table(title=title, caption=caption or None)
    for i, header in enumerate(headers):
        table.add_column(header, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row.cells)
    return table


def print_report(results: dict[str, Summary], opts: Options, env: str) -> None:
    headers = [h.format(inflight=opts.inflight, wide=opts.wide_inflight) for h in HEADERS]
    cpu_headers = [h.format(inflight=opts.inflight) for h in CPU_HEADERS]
    rows, cpu = build_rows(results), cpu_rows(results)
    if opts.markdown:
        print(f"_{env}_\n")
        print("\n".join(_markdown_table(headers, rows)))
        print()
        for line in target_lines(results):
            print(f"- {line}")
        print("\nCPU time per call (user + system) of each process:\n")
        print("\n".join(_markdown_table(cpu_headers, cpu)))
        for phase, title in PHASES:
            print(f"\nServer-side commands per call, {title} (INFO commandstats):\n")
            for line in breakdown_lines(results, phase):
                print(f"- {line}")
        return
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 160))  # a pipe has no width; do not squeeze
    console.print(_rich_table("prq RPC benchmark", headers, rows, env))
    for line in target_lines(results):
        console.print(line, highlight=False)
    console.print(_rich_table("CPU time per call (user + system)", cpu_headers, cpu, ""))
    for phase, title in PHASES:
        console.print(f"server-side commands per call, {title} (INFO commandstats):")
        for line in breakdown_lines(results, phase):
            console.print(f"  {line}", highlight=False)


def _cleanup(client: redis.Redis, prefix: str) -> None:
    """Delete what this run left behind (its prefix is unique to the run)."""
    batch = []
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        batch.append(key)
        if len(batch) >= 500:
            client.unlink(*batch)
            batch.clear()
    if batch:
        client.unlink(*batch)


# -- command line --------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/rpc.py",
        description="prq against a raw redis-py list RPC on one Redis (see the module docstring).",
    )
    env = os.environ.get
    parser.add_argument(
        "--url",
        default=env("PRQ_REDIS_URL"),
        help="Redis URL (default: PRQ_REDIS_URL, else an embedded redis-server)",
    )
    parser.add_argument("--calls", type=int, default=int(env("PRQ_BENCH_CALLS", "10000")))
    parser.add_argument("--seq-calls", type=int, default=int(env("PRQ_BENCH_SEQ_CALLS", "2000")))
    parser.add_argument("--warmup", type=int, default=int(env("PRQ_BENCH_WARMUP", "200")))
    parser.add_argument("--inflight", type=int, default=int(env("PRQ_BENCH_INFLIGHT", "64")))
    parser.add_argument(
        "--wide-inflight",
        type=int,
        default=int(env("PRQ_BENCH_WIDE_INFLIGHT", "256")),
        help="calls in flight in a second throughput phase (0: skip it)",
    )
    parser.add_argument(
        "--only", default=None, help=f"comma-separated subset of {', '.join(VARIANTS)}"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=int(env("PRQ_BENCH_REPEAT", "1")),
        help="run the variants this many times, interleaved, and report medians (noisy hosts)",
    )
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    parser.add_argument("--verbose", "-v", action="store_true", help="log at INFO")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    relax_collector()
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.WARNING,
            format="%(asctime)s %(name)s %(levelname)s %(message)s",
        )
    variants = VARIANTS
    if args.only:
        variants = tuple(v.strip() for v in args.only.split(",") if v.strip())
        unknown = set(variants) - set(VARIANTS)
        if unknown:
            print(f"unknown variant(s) {sorted(unknown)}; choose from {VARIANTS}", file=sys.stderr)
            return 2
    if (
        min(args.calls, args.seq_calls, args.inflight, args.repeat) < 1
        or min(args.warmup, args.wide_inflight) < 0
    ):
        print(
            "--calls, --seq-calls, --inflight and --repeat must be >= 1, "
            "--warmup and --wide-inflight >= 0",
            file=sys.stderr,
        )
        return 2
    with contextlib.ExitStack() as stack:
        url = args.url
        if not url:
            embedded = EmbeddedRedis().start()
            stack.callback(embedded.cleanup)
            url = embedded.url
        opts = Options(
            url=url,
            calls=args.calls,
            seq_calls=args.seq_calls,
            warmup=args.warmup,
            inflight=args.inflight,
            wide_inflight=args.wide_inflight,
            variants=variants,
            markdown=args.markdown,
            repeat=args.repeat,
            prefix=f"prqbench-{uuid.uuid4().hex[:8]}",
        )
        control = redis.Redis.from_url(url)
        stack.callback(control.close)
        stack.callback(_cleanup, control, opts.prefix)
        counters = ServerCounters(control)
        runs: dict[str, list[Measured]] = {variant: [] for variant in variants}
        for round_no in range(1, opts.repeat + 1):
            for variant in variants:
                suffix = f" (run {round_no}/{opts.repeat})" if opts.repeat > 1 else ""
                print(f"running {variant}{suffix} ...", file=sys.stderr, flush=True)
                try:
                    runs[variant].append(measure(variant, opts, counters))
                except Exception as exc:
                    logger.error("variant %s failed: %s", variant, exc, exc_info=True)
                    return 1
        results = {variant: Summary(measured) for variant, measured in runs.items()}
        print_report(results, opts, environment_line(control, opts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
