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

The servers live in bench/rpc_servers.py, the clients in bench/rpc_clients.py, the counters and
medians in bench/rpc_measures.py, the report in bench/rpc_report.py.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

import redis

if not __package__:
    # Run as `python bench/rpc.py`: make the checkout's root importable, for the `bench.rpc_*`
    # modules here and in the spawned server processes (spawn passes sys.path on to them).
    # (Appended: which prq is imported stays what it was.)
    _ROOT = str(Path(__file__).resolve().parent.parent)
    if _ROOT not in sys.path:
        sys.path.append(_ROOT)

from bench.rpc_clients import measure
from bench.rpc_measures import Measured, Options, ServerCounters, Summary
from bench.rpc_report import environment_line, print_report
from prq.embedded import EmbeddedRedis
from prq.serve.collector import relax_collector

logger = logging.getLogger(__name__)

#: Every variant, in the order they run; a prq variant is compared with the raw one of its facade.
VARIANTS = ("raw-async", "raw-sync", "prq-async", "prq-sync")


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
