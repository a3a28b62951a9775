"""bench/footprint.py's runs (Bench): each variant writes its requests to a fresh key space of
one Redis, and Redis's memory, key count and CPU are read before and after; prq's delta is
broken down by kind of key.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Callable, Iterator

import redis

from bench.footprint_measures import (
    BULK,
    ENDPOINT,
    KEYED,
    LIST,
    NOTIFY,
    SCRIPTED,
    Measured,
    Part,
    Snapshot,
    params,
    payload,
)
from prq import AsyncQueue, QueueSettings, Request
from prq.bulk import BulkClient
from prq.core.errors import PrqError
from prq.core.keys import KeySchema
from prq.core.models import Response
from prq.core.names import new_request_id

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
