"""Fairness benchmark: an interactive caller's latency while a bulk producer keeps a backlog
queued on the same endpoint, with producers taking turns and as one FIFO line; plus what a
fair take costs Redis against a plain list take.

In one run, on one Redis:

  latency   A bulk producer (prq.bulk, producer "bulk") keeps BACKLOG requests queued on one
            endpoint, topped up as an echo worker (`prq worker`, its own process) drains them.
            An interactive caller (AsyncQueue.call) then measures its round trips:
              fair  its requests carry its own producer (the default: its node id), so they
                    take turns with the bulk producer's (prq's scheduling);
              fifo  its requests carry the bulk producer's name, so they queue behind the
                    whole backlog, as in a plain FIFO queue.
  take cost Sequential takes of one request each (prq's take script, as receivers send it)
            from a queue of TAKES requests: one producer at one priority, 1,000 producers
            taking turns, three priorities; against a plain take (a Lua script that pops a list
            and does the same hash, receipt and in-flight writes, with no scheduling).
            Redis's own time per take comes from INFO commandstats (evalsha usec per call).

Uses PRQ_REDIS_URL when set, else an embedded redis-server.

    python bench/fairness.py [--backlog 100000] [--calls 200] [--fifo-calls 10] [--takes 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from prq import AsyncQueue, QueueSettings, Request
from prq.bulk import BulkClient
from prq.core.keys import EndpointKeys, KeySchema
from prq.embedded import redis_url_or_embedded
from prq.protocol.scripts.loading import TAKE
from prq.protocol.scripts.redelivery import Redelivery
from prq.protocol.scripts.take import take_call

ROOT = Path(__file__).resolve().parent.parent
#: The scheduling helpers the scripts include (scripts/_queue.lua).
_QUEUE_LIB = (ROOT / "prq" / "protocol" / "scripts" / "_queue.lua").read_text("utf-8")
ENDPOINT = "poll://bench-fair"
BULK = "bulk"
#: Receiver slots of the echo worker.
WORKER_CONCURRENCY = 32
#: Requests per top-up of the backlog.
TOP_UP = 2000
#: Longest a request may wait (the FIFO phase waits behind the whole backlog).
PICKUP_TIMEOUT_S = 600.0

#: The plain take the fair one is compared with: pop a list, then the same writes as take.lua.
PLAIN_TAKE = """
local id = redis.call('LPOP', KEYS[1])
if not id then return {} end
local key = KEYS[2] .. id
local st, body, att = unpack(redis.call('HMGET', key, 'st', 'b', 'att'))
redis.call('HSET', key, 'st', 'taken', 'own', ARGV[1], 'rcv', ARGV[2], 'att', (att or 0) + 1)
redis.call('PEXPIRE', key, 300000)
redis.call('RPUSH', KEYS[3], id)
redis.call('PEXPIRE', KEYS[3], 120000)
redis.call('ZADD', KEYS[4], 1, id)
return {id, body}
"""


def echo(request: Any) -> Any:
    """The worker's handler."""
    return request.params


# -- latency ----------------------------------------------------------------------------------


def _start_worker(url: str, prefix: str) -> subprocess.Popen[str]:
    env = os.environ | {"PRQ_REDIS_URL": url, "PRQ_PREFIX": prefix}
    worker = subprocess.Popen(
        [sys.executable, "-m", "prq.cli", "worker", "bench.fairness:echo", "-e", ENDPOINT,
         "-c", str(WORKER_CONCURRENCY)],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert worker.stderr is not None
    deadline = time.monotonic() + 60
    for line in worker.stderr:  # bounded by the worker's own start-up, checked below
        if "prq worker: serving" in line:
            threading.Thread(target=worker.stderr.read, daemon=True).start()  # keep it drained
            return worker
        if time.monotonic() > deadline:
            break
    worker.kill()
    raise RuntimeError("the echo worker did not start")


class Backlog:
    """Keeps `size` bulk requests queued on ENDPOINT from a thread of its own."""

    def __init__(self, url: str, prefix: str, size: int) -> None:
        settings = QueueSettings(pickup_timeout_s=PICKUP_TIMEOUT_S)
        self.bulk = BulkClient.from_url(url, prefix=prefix, settings=settings)
        self.level = KeySchema(prefix).endpoint(ENDPOINT).level(0)
        self.monitor = redis.Redis.from_url(url)
        self.size = size
        self.sent = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def depth(self) -> int:
        return int(self.monitor.hget(self.level, "n") or 0)  # the level's depth (_queue.lua)

    def fill(self) -> None:
        while (missing := self.size - self.depth()) > 0:
            self._send(min(missing, TOP_UP))

    def _send(self, n: int) -> None:
        requests = [
            Request(endpoint=ENDPOINT, method="bulk", params=self.sent + i, producer=BULK)
            for i in range(n)
        ]
        self.sent += self.bulk.enqueue_many(requests).accepted

    def _run(self) -> None:
        while not self.stop.wait(0.02):
            missing = self.size - self.depth()
            if missing > 0:
                self._send(min(missing, TOP_UP))

    def __enter__(self) -> Backlog:
        self.fill()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)
        self.bulk.close()
        self.monitor.close()


async def _latencies(url: str, prefix: str, calls: int, fifo_calls: int) -> dict[str, list[float]]:
    settings = QueueSettings(pickup_timeout_s=PICKUP_TIMEOUT_S)
    async with AsyncQueue.from_url(url, prefix=prefix, settings=settings) as queue:
        fair = []
        for i in range(calls):
            started = time.perf_counter()
            await queue.call(ENDPOINT, "interactive", i)
            fair.append(time.perf_counter() - started)

        async def fifo_call(i: int) -> float:
            started = time.perf_counter()
            await queue.call(ENDPOINT, "interactive", i, producer=BULK)
            return time.perf_counter() - started

        tasks = []
        for i in range(fifo_calls):
            tasks.append(asyncio.create_task(fifo_call(i)))
            await asyncio.sleep(0.5)  # paced sends: each waits behind the backlog of its time
        fifo = list(await asyncio.wait_for(asyncio.gather(*tasks), PICKUP_TIMEOUT_S))
    return {"fair": fair, "fifo": fifo}


def latency_phase(url: str, prefix: str, backlog: int, calls: int, fifo_calls: int) -> str:
    with Backlog(url, prefix, backlog) as bulk:
        worker = _start_worker(url, prefix)
        try:
            found = asyncio.run(_latencies(url, prefix, calls, fifo_calls))
            depth = bulk.depth()
        finally:
            worker.terminate()
            worker.wait(30)
    lines = [
        f"interactive caller vs a bulk producer keeping {backlog:,} queued "
        f"(depth at the end: {depth:,})",
        "",
        "| scheduling | calls | p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, label in (("fair", "producers take turns (prq)"), ("fifo", "one FIFO line")):
        values = sorted(v * 1000 for v in found[name])
        p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
        lines.append(
            f"| {label} | {len(values)} | {statistics.median(values):,.1f} | {p99:,.1f} "
            f"| {values[-1]:,.1f} |"
        )
    return "\n".join(lines)


# -- take cost --------------------------------------------------------------------------------


def _evalsha_stats(client: redis.Redis) -> tuple[int, int]:
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


def _time_takes(client: redis.Redis, n: int, take: Callable[[str], Any]) -> tuple[float, float]:
    """(client µs per take, Redis µs per take) over n sequential takes."""
    calls0, usec0 = _evalsha_stats(client)
    started = time.perf_counter()
    for _ in range(n):
        if not take(uuid.uuid4().hex):
            raise RuntimeError("the queue ran dry")
    elapsed = time.perf_counter() - started
    calls1, usec1 = _evalsha_stats(client)
    return elapsed / n * 1e6, (usec1 - usec0) / max(1, calls1 - calls0)


#: The two pops alone, without the rest of a take: a list pop, and prq's scheduling step.
PLAIN_POP = "return redis.call('LPOP', KEYS[1])"
FAIR_POP = _QUEUE_LIB + "\nreturn queue_pop(KEYS[1], KEYS[2])"
#: How the requests of a take-cost run are spread: request i -> (producer, priority).
LAYOUTS: dict[str, Callable[[int], tuple[str, int]]] = {
    "1 producer, 1 priority": lambda i: (BULK, 0),
    "1,000 producers, 1 priority": lambda i: (f"p{i % 1000}", 0),
    "3 priorities": lambda i: (BULK, (i % 3) * 5),
}


def _queue_layout(url: str, n: int, layout: Callable[[int], tuple[str, int]]) -> str:
    """Queue n requests on ENDPOINT of a fresh prefix, spread by `layout`; the prefix."""
    prefix = f"prq-bench-take-{uuid.uuid4().hex[:6]}"
    settings = QueueSettings(pickup_timeout_s=PICKUP_TIMEOUT_S)
    requests = []
    for i in range(n):
        producer, priority = layout(i)
        requests.append(
            Request(endpoint=ENDPOINT, method="m", params=i, producer=producer, priority=priority)
        )
    with BulkClient.from_url(url, prefix=prefix, settings=settings) as bulk:
        bulk.enqueue_many(requests)
    return prefix


def _queue_plain(client: redis.Redis, n: int) -> EndpointKeys:
    """n request hashes and a plain list of their ids, for the baselines."""
    keys = KeySchema(f"prq-bench-plain-{uuid.uuid4().hex[:6]}").endpoint(ENDPOINT)
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        pipe.hset(keys.request(f"id-{i}"), mapping={"st": "queued", "b": "{}", "att": 0})
        pipe.rpush(f"{keys.tag}:plain", f"id-{i}")
    pipe.execute()
    return keys


def take_cost_phase(url: str, takes: int) -> str:
    client = redis.Redis.from_url(url)
    client.script_load(TAKE.source)
    plain_take_sha = client.script_load(PLAIN_TAKE)
    plain_pop_sha = client.script_load(PLAIN_POP)
    fair_pop_sha = client.script_load(FAIR_POP)

    def evalsha(sha: str, *keys: str) -> Callable[[str], Any]:
        def run(token: str) -> Any:
            return client.evalsha(sha, len(keys), *keys, token, "bench")

        return run

    redelivery = Redelivery.of(QueueSettings())

    def prq_take(keys: EndpointKeys) -> Callable[[str], Any]:
        def take(token: str) -> Any:
            call = take_call(keys, token, "bench", 2000, 1, 100, 300_000,
                             120_000, 0, 86_400_000, 60_000, redelivery)  # fmt: skip
            reply: list[Any] = client.execute_command(*call.args)  # type: ignore[no-untyped-call]
            return reply[3:]

        return take

    def plain_take(keys: EndpointKeys) -> Callable[[str], Any]:
        plain_keys = (f"{keys.tag}:plain", keys.request_prefix)

        def take(token: str) -> Any:
            more = (keys.take_receipt(token), keys.running)
            return client.evalsha(plain_take_sha, 4, *plain_keys, *more, token, "bench")

        return take

    rows = [("whole take", "plain list (baseline)",
             *_time_takes(client, takes, plain_take(_queue_plain(client, takes))))]  # fmt: skip
    for name, layout in LAYOUTS.items():
        keys = KeySchema(_queue_layout(url, takes, layout)).endpoint(ENDPOINT)
        rows.append(("whole take", f"prq: {name}", *_time_takes(client, takes, prq_take(keys))))
    plain_pop = evalsha(plain_pop_sha, f"{_queue_plain(client, takes).tag}:plain")
    rows.append(("pop only", "plain list (baseline)", *_time_takes(client, takes, plain_pop)))
    for name, layout in LAYOUTS.items():
        keys = KeySchema(_queue_layout(url, takes, layout)).endpoint(ENDPOINT)
        pop = evalsha(fair_pop_sha, keys.levels, keys.level_prefix)
        rows.append(("pop only", f"prq: {name}", *_time_takes(client, takes, pop)))
    client.close()
    lines = [
        f"one request per take, {takes:,} sequential takes per row; a whole take also marks the "
        "request taken, lists it in the receipt and the in-flight set (prq's take.lua does "
        "more: limits, parking, counters); pop only is the scheduling step alone",
        "",
        "| step | queue | client µs | Redis µs | Redis time vs baseline |",
        "|---|---|---:|---:|---:|",
    ]
    base = {step: redis_us for step, name, _, redis_us in rows if "baseline" in name}
    for step, name, client_us, redis_us in rows:
        lines.append(
            f"| {step} | {name} | {client_us:.0f} | {redis_us:.1f} | {redis_us / base[step]:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--fifo-calls", type=int, default=10)
    parser.add_argument("--takes", type=int, default=20_000)
    args = parser.parse_args(argv)
    with redis_url_or_embedded() as url:
        prefix = f"prq-bench-fair-{uuid.uuid4().hex[:6]}"
        print(latency_phase(url, prefix, args.backlog, args.calls, args.fifo_calls), flush=True)
        print()
        print(take_cost_phase(url, args.takes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
