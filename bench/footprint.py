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

The runs live in bench/footprint_bench.py, what they measure in bench/footprint_measures.py,
the report in bench/footprint_report.py.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

if not __package__:
    # Run as `python bench/footprint.py`: make the checkout's root importable, for the
    # `bench.footprint_*` modules. (Appended: which prq is imported stays what it was.)
    _ROOT = str(Path(__file__).resolve().parent.parent)
    if _ROOT not in sys.path:
        sys.path.append(_ROOT)

from bench.footprint_bench import Bench
from bench.footprint_measures import BULK, KEYED, LIST, NOTIFY, SCRIPTED, SEND
from bench.footprint_report import environment_line, print_report
from prq.embedded import redis_url_or_embedded

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
