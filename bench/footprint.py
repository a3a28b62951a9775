"""Footprint benchmark: what a queued request costs Redis (memory, keys, CPU) against a plain list
entry, in one run, on one Redis, with no receiver running.

Variants, each on a fresh key space (the requests stay queued while they are measured):

  list     RPUSH of the payload onto one list, 1,000 per call (the floor)
  keyed    SET <prefix>:kv:<id> <payload> PX <ttl> NX, 1,000 per pipelined call: one key with a
           TTL per request, written once per id (the floor of any layout that keeps each
           request under its own key with its own TTL, as prq does)
  scripted the same SET PX NX per request, from one Lua script per 1,000 (EVALSHA, the keys and
           payloads as its arguments, nothing else done): the floor of any enqueue that checks
           and writes its ids inside one script, as prq does to keep a batch atomic
  bulk     BulkClient.enqueue_many with Request objects, 1,000 per call (dedup by id, as always)
  notify   AsyncQueue.notify, one at a time, each awaited (a one-way message)
  send     AsyncQueue.send, one at a time, each awaited (the layout of `call`: the request names
           the node waiting for its answer)

The payload is a compact JSON document of exactly 100 bytes (or 1 KiB): the list entry itself,
and prq's request params. prq's requests use the ids prq makes and QueueSettings with a one-hour
pickup timeout, so that nothing expires while a run measures it (a TTL costs the same whatever
its length).

Figures:
  B/request          (used_memory - mem_clients_normal) after the writes, minus before, per
                     request (INFO memory): the data, the key-space and TTL tables and allocator
                     rounding; the clients' buffers are left out, so the figure does not depend
                     on who is connected. Writers load their scripts before the first figure.
  keys/request       DBSIZE delta per request.
  Redis µs/request   INFO cpu (used_cpu_sys + used_cpu_user) delta over the writes, per request
                     (notify and send: a round trip per request, and for send the polls of the
                     senders still waiting, one per poll_interval_s each).
  requests/s         requests per second spent inside the enqueue calls; rows and Request
                     objects are built outside the clock (for notify and send, the whole call).
  client µs/request  this process's CPU time inside those calls.

The breakdown says where prq's bytes go: each kind of key it wrote, its MEMORY USAGE (SAMPLES 0;
averaged over up to SAMPLE_KEYS keys of a kind with one key per request), its encoding, and its
share of the delta; "the rest" is what MEMORY USAGE does not count (TTL entries, the key-space
tables' buckets, allocator rounding).

Targets (issue 16; printed as PASS/MISS, never asserted): at most 400 B per queued 100-byte
request, at most 2.5 µs of Redis CPU per bulk-enqueued request, at least 150,000 BulkClient
requests/s. Memory figures do not move with load; CPU and rate figures do (other work on the
host, cores shared with Redis).

By default the run starts its own redis-server and FLUSHALLs it between variants. Given a server
(--url, PRQ_REDIS_URL) it flushes nothing: keys go under a fresh prefix inside `prq:*`, deleted
before each variant and at the end; the deltas then include what other clients write meanwhile.

    python bench/footprint.py [--sizes 10000,1000000] [--kib-sizes 10000] [--one-by-one 10000]
                              [--markdown]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from pydantic import JsonValue
from rich.console import Console
from rich.table import Table

from prq import AsyncQueue, QueueSettings, Request
from prq.bulk import BulkClient
from prq.core.errors import PrqError
from prq.core.keys import KeySchema
from prq.core.models import Response
from prq.core.names import new_request_id
from prq.embedded import redis_url_or_embedded

#: The scripted baseline: one SET PX NX per key/payload pair of ARGV (ARGV[1]: the TTL, ms).
FLOOR_SCRIPT = """
local ttl, written = ARGV[1], 0
for i = 2, #ARGV, 2 do
  if redis.call('SET', ARGV[i], ARGV[i + 1], 'PX', ttl, 'NX') then written = written + 1 end
end
return written
"""
#: Requests per call of the bulk variants (BulkClient's default batch, and the RPUSH baseline's).
BATCH = 1000
ENDPOINT = "poll://footprint"
#: Where each writer sends one request before the first figure (connects, loads its scripts).
WARM_ENDPOINT = "poll://footprint-warm"
METHOD = "m"
#: Nothing expires while it is measured; the figures do not depend on a TTL's length.
SETTINGS = QueueSettings(pickup_timeout_s=3600)
#: Keys of one kind whose MEMORY USAGE is averaged.
SAMPLE_KEYS = 16
#: Bounds: one variant, the memory settling after the writes, a SCAN of the key space.
PHASE_TIMEOUT_S = 600.0
SETTLE_INTERVAL_S = 0.3
SETTLE_READS = 10
SCAN_TIMEOUT_S = 300.0
#: Issue 16's targets.
TARGET_BYTES = 400
TARGET_REDIS_US = 2.5
TARGET_RATE = 150_000

#: The variants, as the tables name them (see the module docstring).
LIST = "list, RPUSH 1,000/call"
KEYED = "key per request, SET PX NX 1,000/call"
SCRIPTED = "key per request from a script, 1,000/call"
BULK = "prq bulk, 1,000/call"
NOTIFY = "prq notify, one by one"
SEND = "prq send, one by one"


def params(i: int, size: int) -> dict[str, JsonValue]:
    """Params whose compact JSON is exactly `size` bytes, different for every i."""
    head = len('{"key":"0000000000","pad":""}')
    return {"key": f"{i:010d}", "pad": "x" * (size - head)}


def payload(i: int, size: int) -> bytes:
    """The list baseline's entry: the bytes prq's request carries as its params."""
    return json.dumps(params(i, size), separators=(",", ":")).encode()


# -- measuring -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What Redis holds: its data's bytes (clients' buffers left out) and its key count."""

    footprint: int
    keys: int


class Clock:
    """Wall and CPU time of this process, summed over the blocks it times."""

    def __init__(self) -> None:
        self.wall_s = 0.0
        self.cpu_s = 0.0

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.wall_s += time.perf_counter() - wall
            self.cpu_s += time.process_time() - cpu


@dataclass(frozen=True, slots=True)
class Part:
    """One kind of key in prq's delta."""

    kind: str
    keys: int
    encoding: str
    bytes_per_key: float
    bytes_total: float


@dataclass(slots=True)
class Measured:
    """One variant at one payload size and one count."""

    variant: str
    size: int
    requests: int
    footprint: int = 0
    keys: int = 0
    redis_cpu_s: float = 0.0
    clock: Clock = field(default_factory=Clock)
    parts: list[Part] = field(default_factory=list)

    @property
    def bytes_per_request(self) -> float:
        return self.footprint / self.requests

    @property
    def keys_per_request(self) -> float:
        return self.keys / self.requests

    @property
    def redis_us(self) -> float:
        return self.redis_cpu_s * 1e6 / self.requests

    @property
    def rate(self) -> float:
        return self.requests / self.clock.wall_s

    @property
    def client_us(self) -> float:
        return self.clock.cpu_s * 1e6 / self.requests


class Bench:
    """Runs the variants on one Redis; owns the key space only when it owns the server."""

    def __init__(self, url: str, *, own_server: bool) -> None:
        self.url = url
        self.own_server = own_server
        #: The default prefix on a server of our own (the key names users get); a fresh one
        #: inside `prq:*` (what the shipped ACL grants) on a server we were given.
        self.prefix = "prq" if own_server else f"prq:footprint-{uuid.uuid4().hex[:6]}"
        self.keys = KeySchema(self.prefix)
        self.control = redis.Redis.from_url(url, socket_timeout=60)

    def close(self) -> None:
        self.clear()
        self.control.close()

    def clear(self) -> None:
        """A fresh key space: FLUSHALL on our own server, else delete our prefix's keys."""
        if self.own_server:
            self.control.flushall()  # synchronous: lazyfree-lazy-user-flush is off by default
            return
        batch: list[bytes] = []
        for key in self._scan():
            batch.append(key)
            if len(batch) == 1000:
                self.control.delete(*batch)
                batch.clear()
        if batch:
            self.control.delete(*batch)

    def _scan(self) -> Iterator[bytes]:
        """Every key of our prefix (SCAN, bounded by SCAN_TIMEOUT_S)."""
        deadline = time.monotonic() + SCAN_TIMEOUT_S
        cursor = 0
        while True:
            cursor, keys = self.control.scan(cursor, match=f"{self.prefix}:*", count=10_000)
            for key in keys:
                assert isinstance(key, bytes)  # replies are not decoded
                yield key
            if cursor == 0:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"SCAN did not finish in {SCAN_TIMEOUT_S} s")

    def redis_cpu_s(self) -> float:
        cpu = self.control.info("cpu")
        return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])

    def snapshot(self) -> Snapshot:
        memory = self.control.info("memory")
        footprint = int(memory["used_memory"]) - int(memory.get("mem_clients_normal", 0))
        return Snapshot(footprint, int(self.control.dbsize()))

    def settled(self) -> Snapshot:
        """A snapshot once two reads SETTLE_INTERVAL_S apart agree (at most SETTLE_READS)."""
        last = self.snapshot()
        for _ in range(SETTLE_READS):
            time.sleep(SETTLE_INTERVAL_S)
            now = self.snapshot()
            if now == last:
                break
            last = now
        return last

    def finish(self, m: Measured, before: Snapshot, cpu_before: float) -> None:
        """Record the deltas since `before` (the CPU one ends now, before memory settles)."""
        m.redis_cpu_s = self.redis_cpu_s() - cpu_before
        after = self.settled()
        m.footprint = after.footprint - before.footprint
        m.keys = after.keys - before.keys

    # -- variants --------------------------------------------------------------------------------

    def run_list(self, size: int, n: int) -> Measured:
        m = Measured(LIST, size, n)
        self.clear()
        key = f"{self.prefix}:footprint-list"
        writer = redis.Redis.from_url(self.url)
        try:
            writer.ping()
            before = self.settled()
            cpu = self.redis_cpu_s()
            deadline = time.monotonic() + PHASE_TIMEOUT_S
            for start in range(0, n, BATCH):
                rows = [payload(i, size) for i in range(start, min(n, start + BATCH))]
                with m.clock.running():
                    writer.rpush(key, *rows)
                _check(deadline)
        finally:
            writer.close()
        self.finish(m, before, cpu)
        return m

    def run_keyed(self, size: int, n: int) -> Measured:
        m = Measured(KEYED, size, n)
        self.clear()
        writer = redis.Redis.from_url(self.url)
        ttl_ms = int(SETTINGS.request_ttl_s(SETTINGS.pickup_timeout_s) * 1000)
        try:
            writer.ping()
            before = self.settled()
            cpu = self.redis_cpu_s()
            deadline = time.monotonic() + PHASE_TIMEOUT_S
            for start in range(0, n, BATCH):
                rows = [
                    (f"{self.prefix}:kv:{new_request_id()}", payload(i, size))
                    for i in range(start, min(n, start + BATCH))
                ]
                with m.clock.running():
                    pipe = writer.pipeline(transaction=False)
                    for key, row in rows:
                        pipe.set(key, row, px=ttl_ms, nx=True)
                    pipe.execute()
                _check(deadline)
        finally:
            writer.close()
        self.finish(m, before, cpu)
        return m

    def run_scripted(self, size: int, n: int) -> Measured:
        m = Measured(SCRIPTED, size, n)
        self.clear()
        writer = redis.Redis.from_url(self.url)
        ttl_ms = int(SETTINGS.request_ttl_s(SETTINGS.pickup_timeout_s) * 1000)
        try:
            sha = writer.script_load(FLOOR_SCRIPT)
            before = self.settled()
            cpu = self.redis_cpu_s()
            deadline = time.monotonic() + PHASE_TIMEOUT_S
            for start in range(0, n, BATCH):
                args: list[str | bytes | int] = [ttl_ms]
                for i in range(start, min(n, start + BATCH)):
                    args += [f"{self.prefix}:ks:{new_request_id()}", payload(i, size)]
                with m.clock.running():
                    written = writer.evalsha(sha, 0, *args)
                if written != (len(args) - 1) // 2:
                    raise RuntimeError(f"the script wrote {written} of {(len(args) - 1) // 2}")
                _check(deadline)
        finally:
            writer.close()
        self.finish(m, before, cpu)
        return m

    def run_bulk(self, size: int, n: int) -> Measured:
        m = Measured(BULK, size, n)
        self.clear()
        with BulkClient.from_url(self.url, prefix=self.prefix, settings=SETTINGS) as bulk:
            bulk.enqueue_many([Request(endpoint=WARM_ENDPOINT, method=METHOD)])
            existing = set(self._scan())
            before = self.settled()
            cpu = self.redis_cpu_s()
            deadline = time.monotonic() + PHASE_TIMEOUT_S
            for start in range(0, n, BATCH):
                batch = [
                    Request(endpoint=ENDPOINT, method=METHOD, params=params(i, size))
                    for i in range(start, min(n, start + BATCH))
                ]
                with m.clock.running():
                    result = bulk.enqueue_many(batch)
                if result.accepted != len(batch):
                    raise RuntimeError(f"BulkClient accepted {result.accepted} of {len(batch)}")
                _check(deadline)
        self.finish(m, before, cpu)
        m.parts = self.breakdown(m, existing)
        return m

    def run_one_by_one(self, variant: str, size: int, n: int) -> Measured:
        m = Measured(variant, size, n)
        self.clear()
        asyncio.run(self._one_by_one(m))
        return m

    async def _one_by_one(self, m: Measured) -> None:
        outcomes: list[Response | PrqError] = []
        async with AsyncQueue.from_url(self.url, prefix=self.prefix, settings=SETTINGS) as queue:

            async def enqueue(endpoint: str, i: int) -> None:
                if m.variant == NOTIFY:
                    await queue.notify(endpoint, METHOD, params(i, m.size))
                    return
                request = queue.build_request(endpoint, METHOD, params(i, m.size))
                await queue.send(request, on_response=outcomes.append, on_failure=outcomes.append)

            await enqueue(WARM_ENDPOINT, 0)
            existing = set(await asyncio.to_thread(self._scan))
            before = await asyncio.to_thread(self.settled)
            cpu = self.redis_cpu_s()
            async with asyncio.timeout(PHASE_TIMEOUT_S):
                with m.clock.running():
                    for i in range(m.requests):
                        await enqueue(ENDPOINT, i)
            await asyncio.to_thread(self.finish, m, before, cpu)
            m.parts = await asyncio.to_thread(self.breakdown, m, existing)
            if outcomes:  # checked before closing, whose shutdown fails the sends still waiting
                raise RuntimeError(f"{len(outcomes)} sends ended early, first: {outcomes[0]!r}")

    # -- where the bytes go ----------------------------------------------------------------------

    def breakdown(self, m: Measured, existing: set[bytes]) -> list[Part]:
        """The keys the variant wrote, by kind, with their MEMORY USAGE; then the rest."""
        endpoint = self.keys.endpoint(ENDPOINT)
        kinds: list[tuple[str, Callable[[str], bool]]] = [
            ("request record", lambda key: key.startswith(endpoint.request_prefix)),
            ("locator", lambda key: key.startswith(f"{self.prefix}:loc:")),
            (
                "producer lane (list)",
                lambda key: (
                    re.fullmatch(re.escape(endpoint.level_prefix) + r"-?\d+:p.*", key) is not None
                ),
            ),
            ("other keys (one per endpoint or node)", lambda key: True),
        ]
        counts = dict.fromkeys((kind for kind, _ in kinds), 0)
        samples: dict[str, list[str]] = {kind: [] for kind, _ in kinds}
        for raw in self._scan():
            if raw in existing:
                continue
            key = raw.decode()
            kind = next(kind for kind, matches in kinds if matches(key))
            counts[kind] += 1
            if len(samples[kind]) < SAMPLE_KEYS:  # SCAN's order is the hash table's: a mix
                samples[kind].append(key)
        parts = []
        for kind, keys in samples.items():
            if not keys:
                continue
            usage = [int(self.control.memory_usage(key, samples=0) or 0) for key in keys]
            encodings = sorted({self.control.object("encoding", key).decode() for key in keys})
            per_key = sum(usage) / len(usage)
            parts.append(
                Part(kind, counts[kind], "/".join(encodings), per_key, per_key * counts[kind])
            )
        rest = m.footprint - sum(part.bytes_total for part in parts)
        parts.append(Part("the rest: TTLs, key-space tables, allocator rounding", 0, "", 0.0, rest))
        return parts


def _check(deadline: float) -> None:
    if time.monotonic() > deadline:
        raise TimeoutError(f"a variant did not finish in {PHASE_TIMEOUT_S} s")


# -- reporting -----------------------------------------------------------------------------------

HEADERS = (
    "variant",
    "payload",
    "queued",
    "B/request",
    "vs list",
    "keys/request",
    "Redis µs/request",
    "vs list",
    "requests/s",
    "vs list",
    "client µs/request",
)
PART_HEADERS = (
    "variant",
    "payload",
    "queued",
    "key kind",
    "keys/request",
    "encoding",
    "B per key",
    "B/request",
    "share",
)


def _baseline(results: Sequence[Measured], m: Measured) -> Measured | None:
    return next(
        (r for r in results if r.variant == LIST and (r.size, r.requests) == (m.size, m.requests)),
        None,
    )


def _ratio(m: Measured, base: Measured | None, metric: Callable[[Measured], float]) -> str:
    return "-" if base is None else f"{metric(m) / metric(base):.2f}x"


def rows(results: Sequence[Measured]) -> list[tuple[str, ...]]:
    """One row per variant run; ratios to the list of the same payload and count (CPU and rate
    only for the variants that also send 1,000 per call)."""
    out: list[tuple[str, ...]] = []
    for m in results:
        base = _baseline(results, m) if m.variant != LIST else None
        bulk_base = base if m.variant in (BULK, KEYED, SCRIPTED) else None
        out.append(
            (
                m.variant,
                f"{m.size:,} B",
                f"{m.requests:,}",
                f"{m.bytes_per_request:,.0f}",
                _ratio(m, base, lambda r: r.bytes_per_request),
                f"{m.keys_per_request:.5g}",
                f"{m.redis_us:.2f}",
                _ratio(m, bulk_base, lambda r: r.redis_us),
                f"{m.rate:,.0f}",
                _ratio(m, bulk_base, lambda r: r.rate),
                f"{m.client_us:.1f}",
            )
        )
    return out


def part_rows(results: Sequence[Measured]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for m in results:
        for part in m.parts:
            out.append(
                (
                    m.variant,
                    f"{m.size:,} B",
                    f"{m.requests:,}",
                    part.kind,
                    f"{part.keys / m.requests:.5g}" if part.keys else "",
                    part.encoding,
                    f"{part.bytes_per_key:,.0f}" if part.keys else "",
                    f"{part.bytes_total / m.requests:,.1f}",
                    f"{part.bytes_total / m.footprint:.0%}" if m.footprint else "-",
                )
            )
    return out


def target_lines(results: Sequence[Measured]) -> list[str]:
    lines = []
    for m in results:
        if m.variant != BULK or m.size != 100:
            continue

        def verdict(ok: bool) -> str:
            return "PASS" if ok else "MISS"

        floors = [
            f"{m.redis_us / r.redis_us:.2f}x {name}"
            for r in results
            for name in [{KEYED: "the keyed write", SCRIPTED: "the scripted one"}.get(r.variant)]
            if name and (r.size, r.requests) == (m.size, m.requests) and r.redis_us > 0
        ]
        beside = f" ({', '.join(floors)} in this run)" if floors else ""
        lines.append(
            f"bulk, 100 B, {m.requests:,} queued: {m.bytes_per_request:,.0f} B per request "
            f"(target <= {TARGET_BYTES} B) {verdict(m.bytes_per_request <= TARGET_BYTES)}; "
            f"Redis CPU {m.redis_us:.2f} µs per request{beside} (target <= {TARGET_REDIS_US} "
            f"µs) {verdict(m.redis_us <= TARGET_REDIS_US)}; {m.rate:,.0f} requests/s "
            f"(target >= {TARGET_RATE:,}) {verdict(m.rate >= TARGET_RATE)}"
        )
    return lines


def environment_line(bench: Bench) -> str:
    server = bench.control.info("server")
    memory = bench.control.info("memory")
    try:
        config = bench.control.config_get("*-max-listpack-*")
        limits = " · " + ", ".join(f"{k} {v}" for k, v in sorted(config.items()))
    except redis.ResponseError:  # CONFIG may be refused on a managed server
        limits = ""
    where = (
        "own redis-server, FLUSHALL between variants"
        if bench.own_server
        else f"given server (shared: deltas include other clients' writes), prefix {bench.prefix}"
    )
    return (
        f"redis {server.get('redis_version', '?')} ({memory.get('mem_allocator', '?')}) · "
        f"redis-py {redis.__version__} · Python {platform.python_version()} · "
        f"{os.cpu_count()} CPUs (load {os.getloadavg()[0]:.1f} at the end) · {where} · "
        f"prefix {bench.prefix!r}, endpoint {ENDPOINT}, prq's ids{limits}"
    )


def _markdown(headers: Sequence[str], table: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |"]
    lines.append(
        "|"
        + "|".join("---" if i == 0 or "kind" in h else "---:" for i, h in enumerate(headers))
        + "|"
    )
    lines.extend("| " + " | ".join(row) + " |" for row in table)
    return lines


def _rich(title: str, headers: Sequence[str], table: Sequence[Sequence[str]], caption: str) -> Any:
    out = Table(title=title, caption=caption or None)
    for i, header in enumerate(headers):
        out.add_column(header, justify="left" if i == 0 or "kind" in header else "right")
    for row in table:
        out.add_row(*row)
    return out


def print_report(results: Sequence[Measured], env: str, *, markdown: bool) -> None:
    if markdown:
        print(f"_{env}_\n")
        print("\n".join(_markdown(HEADERS, rows(results))))
        print()
        for line in target_lines(results):
            print(f"- {line}")
        print("\nWhere prq's bytes go (MEMORY USAGE by key kind):\n")
        print("\n".join(_markdown(PART_HEADERS, part_rows(results))))
        return
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 160))  # a pipe has no width; do not squeeze
    console.print(_rich("prq footprint: a queued request", HEADERS, rows(results), env))
    for line in target_lines(results):
        console.print(line, highlight=False)
    console.print(_rich("where prq's bytes go (MEMORY USAGE by key kind)", PART_HEADERS,
                        part_rows(results), ""))  # fmt: skip


# -- command line --------------------------------------------------------------------------------


#: (variant, payload bytes, requests): one run of one variant.
Step = tuple[str, int, int]


def _counts(text: str) -> list[int]:
    counts = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    if any(count < 1 for count in counts):
        raise argparse.ArgumentTypeError("counts must be >= 1")
    return counts


def plan(sizes: Sequence[int], kib_sizes: Sequence[int], one_by_one: int) -> list[Step]:
    """The runs, in order: each prq run after the list run it is compared with."""
    steps: list[Step] = []
    for size, counts in ((100, sizes), (1024, kib_sizes)):
        for n in counts:
            steps += [(LIST, size, n), (KEYED, size, n), (SCRIPTED, size, n), (BULK, size, n)]
    if one_by_one:
        if (LIST, 100, one_by_one) not in steps:
            steps.append((LIST, 100, one_by_one))
        steps += [(NOTIFY, 100, one_by_one), (SEND, 100, one_by_one)]
    return steps


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/footprint.py",
        description="What a queued request costs Redis, against a plain list entry "
        "(see the module docstring).",
    )
    parser.add_argument(
        "--url", default=None, help="a Redis to use (default: PRQ_REDIS_URL, else an own one)"
    )
    parser.add_argument(
        "--sizes", type=_counts, default=[10_000, 1_000_000],
        help="queued 100-byte requests per run, comma-separated (default 10000,1000000)",
    )  # fmt: skip
    parser.add_argument(
        "--kib-sizes", type=_counts, default=[10_000],
        help="queued 1 KiB requests per run, comma-separated (default 10000; empty: none)",
    )  # fmt: skip
    parser.add_argument(
        "--one-by-one", type=int, default=10_000,
        help="requests queued one at a time by notify and by send (default 10000; 0: none)",
    )  # fmt: skip
    parser.add_argument("--markdown", action="store_true", help="print markdown tables")
    args = parser.parse_args(argv)
    if args.one_by_one < 0:
        parser.error("--one-by-one must be >= 0")
    given = args.url or os.environ.get("PRQ_REDIS_URL")
    with redis_url_or_embedded(given) as url:
        bench = Bench(url, own_server=not given)
        results = []
        try:
            for variant, size, n in plan(args.sizes, args.kib_sizes, args.one_by_one):
                print(f"running {variant}, {size:,} B, {n:,} ...", file=sys.stderr, flush=True)
                if variant == LIST:
                    results.append(bench.run_list(size, n))
                elif variant == KEYED:
                    results.append(bench.run_keyed(size, n))
                elif variant == SCRIPTED:
                    results.append(bench.run_scripted(size, n))
                elif variant == BULK:
                    results.append(bench.run_bulk(size, n))
                else:
                    results.append(bench.run_one_by_one(variant, size, n))
            env = environment_line(bench)
        finally:
            bench.close()
    print_report(results, env, markdown=args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
