"""prq's RPC on one Redis server vs a Redis Cluster of 3 masters, in the same run.

Both run on this machine at once (the same CPUs shared): an embedded redis-server, and an
embedded cluster of 3 masters without replicas (prq.embedded.cluster). Per round and topology,
a server process serves an echo handler (`AsyncQueue.serve`, concurrency `--inflight`) on
`--endpoints` endpoints, which the cluster spreads over its shards; this process calls them in
turn with `AsyncQueue.call`: a sequential phase (p50 latency) and a throughput phase
(`--inflight` callers). Rounds interleave the topologies; the table shows medians.

Redis CPU per call is read from each master's INFO cpu around the throughput phase: per shard,
and summed. The target line: the cluster's throughput >= 0.8x one server's, its p50 <= 1.3x.
What this 2-core machine cannot show: more throughput from more shards (all of them, the
caller and the server share two cores); it shows the cost of routing over shards, and how
evenly the work spreads.

    python bench/cluster.py [--calls N] [--seq-calls N] [--inflight K] [--endpoints E]
                            [--repeat R] [--markdown]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import multiprocessing.synchronize
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from rich.console import Console
from rich.table import Table

from prq import AsyncQueue, Request
from prq.embedded import EmbeddedRedis
from prq.embedded.cluster import EmbeddedCluster

TOPOLOGIES = ("server", "cluster")
TARGET_THROUGHPUT_RATIO = 0.8
TARGET_P50_RATIO = 1.3
SERVER_START_TIMEOUT_S = 30.0
SERVER_STOP_TIMEOUT_S = 10.0
CALL_TIMEOUT_S = 30.0


def _serve_main(
    url: str,
    prefix: str,
    endpoints: list[str],
    concurrency: int,
    ready: multiprocessing.synchronize.Event,
    stop: multiprocessing.synchronize.Event,
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us

    async def echo(request: Request) -> Any:
        return request.params

    async def main() -> None:
        async with AsyncQueue.from_url(url, prefix=prefix) as queue:
            stopping = asyncio.Event()
            serving = [
                asyncio.create_task(
                    queue.serve(endpoint, echo, concurrency=concurrency, stop=stopping)
                )
                for endpoint in endpoints
            ]
            ready.set()
            while not stop.is_set() and not any(task.done() for task in serving):
                await asyncio.sleep(0.1)
            stopping.set()
            await asyncio.wait(serving, timeout=SERVER_STOP_TIMEOUT_S / 2)

    asyncio.run(main())


@contextlib.contextmanager
def serving(url: str, prefix: str, endpoints: list[str], concurrency: int) -> Iterator[None]:
    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    process = ctx.Process(
        target=_serve_main,
        args=(url, prefix, endpoints, concurrency, ready, stop),
        daemon=True,
    )
    process.start()
    try:
        if not ready.wait(SERVER_START_TIMEOUT_S):
            raise RuntimeError(f"the server process was not ready in {SERVER_START_TIMEOUT_S} s")
        yield
    finally:
        stop.set()
        process.join(SERVER_STOP_TIMEOUT_S)
        if process.is_alive():
            process.kill()
            process.join(2.0)


def redis_cpu_s(masters: Sequence[EmbeddedRedis]) -> list[float]:
    """CPU seconds each master has used so far."""
    used = []
    for master in masters:
        with redis.Redis(port=master.port, socket_timeout=5) as client:
            cpu = client.info("cpu")
        used.append(float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]))
    return used


@dataclass
class Run:
    p50_ms: float
    calls_per_s: float
    redis_us_per_shard: list[float] = field(default_factory=list)

    @property
    def redis_us(self) -> float:
        return sum(self.redis_us_per_shard)


async def measure(
    url: str, masters: Sequence[EmbeddedRedis], endpoints: list[str], opts: argparse.Namespace
) -> Run:
    prefix = f"prqbench-{uuid.uuid4().hex[:8]}"
    with serving(url, prefix, endpoints, opts.inflight):
        async with AsyncQueue.from_url(url, prefix=prefix) as queue:

            async def call(i: int) -> None:
                endpoint = endpoints[i % len(endpoints)]
                result = await queue.call(
                    endpoint, "echo", {"i": i}, pickup_timeout_s=CALL_TIMEOUT_S,
                    timeout_s=CALL_TIMEOUT_S,
                )  # fmt: skip
                if result != {"i": i}:
                    raise AssertionError(f"echo returned {result!r}")

            for i in range(min(200, opts.seq_calls)):  # warm up: scripts, subscriptions
                await call(i)
            latencies = []
            for i in range(opts.seq_calls):
                started = time.perf_counter()
                await call(i)
                latencies.append(time.perf_counter() - started)
            next_call = iter(range(opts.calls))

            async def caller() -> None:
                for i in next_call:
                    await call(i)

            before = redis_cpu_s(masters)
            started = time.perf_counter()
            await asyncio.gather(*(caller() for _ in range(opts.inflight)))
            elapsed = time.perf_counter() - started
            after = redis_cpu_s(masters)
    return Run(
        p50_ms=statistics.median(latencies) * 1000,
        calls_per_s=opts.calls / elapsed,
        redis_us_per_shard=[(a - b) * 1e6 / opts.calls for a, b in zip(after, before, strict=True)],
    )


def report(runs: dict[str, list[Run]], opts: argparse.Namespace) -> None:
    def median(topology: str, metric: str) -> float:
        return float(statistics.median(float(getattr(run, metric)) for run in runs[topology]))

    base_tput, base_p50 = median("server", "calls_per_s"), median("server", "p50_ms")
    headers = ("topology", "p50 ms", "p50 ratio", "calls/s", "calls/s ratio",
               "Redis CPU µs/call", "per shard µs/call")  # fmt: skip
    rows = []
    for topology in TOPOLOGIES:
        shards = zip(*(run.redis_us_per_shard for run in runs[topology]), strict=True)
        per_shard = " / ".join(f"{statistics.median(s):.0f}" for s in shards)
        rows.append((
            topology,
            f"{median(topology, 'p50_ms'):.2f}",
            f"{median(topology, 'p50_ms') / base_p50:.2f}x",
            f"{median(topology, 'calls_per_s'):,.0f}",
            f"{median(topology, 'calls_per_s') / base_tput:.2f}x",
            f"{median(topology, 'redis_us'):.0f}",
            per_shard,
        ))  # fmt: skip
    caption = (
        f"{opts.calls} calls @{opts.inflight} in flight, p50 over {opts.seq_calls} sequential "
        f"calls, {opts.endpoints} endpoints, median of {opts.repeat} interleaved rounds; "
        "the cluster: 3 masters, no replicas, on the same 2 cores"
    )
    if opts.markdown:
        print("| " + " | ".join(headers) + " |")
        print("|" + "---|" * len(headers))
        for row in rows:
            print("| " + " | ".join(row) + " |")
        print(f"\n{caption}")
    else:
        table = Table(*headers, title="prq RPC: one server vs a 3-master cluster", caption=caption)
        for row in rows:
            table.add_row(*row)
        Console().print(table)
    tput = median("cluster", "calls_per_s") / base_tput
    p50 = median("cluster", "p50_ms") / base_p50
    ok = tput >= TARGET_THROUGHPUT_RATIO and p50 <= TARGET_P50_RATIO
    print(
        f"target: cluster throughput >= {TARGET_THROUGHPUT_RATIO}x one server's "
        f"({tput:.2f}x), p50 <= {TARGET_P50_RATIO}x ({p50:.2f}x): {'PASS' if ok else 'MISS'}"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--seq-calls", type=int, default=2_000)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--endpoints", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    if min(args.calls, args.seq_calls, args.inflight, args.endpoints, args.repeat) < 1:
        parser.error("every count must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    endpoints = [f"poll://bench-{i}" for i in range(opts.endpoints)]
    with EmbeddedRedis() as server, EmbeddedCluster(masters=3) as cluster:
        where = {"server": (server.url, [server]), "cluster": (cluster.url, cluster.masters)}
        runs: dict[str, list[Run]] = {topology: [] for topology in TOPOLOGIES}
        for round_no in range(1, opts.repeat + 1):
            for topology in TOPOLOGIES:
                print(f"running {topology} (round {round_no}/{opts.repeat}) ...", file=sys.stderr)
                url, masters = where[topology]
                runs[topology].append(asyncio.run(measure(url, masters, endpoints, opts)))
        report(runs, opts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
