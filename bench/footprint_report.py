"""bench/footprint.py's report: the results table, issue 16's targets (PASS/MISS) and where
prq's bytes go, as rich tables or markdown.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Sequence
from typing import Any

import redis
from rich.console import Console
from rich.table import Table

from bench.footprint_bench import Bench
from bench.footprint_measures import BULK, ENDPOINT, KEYED, LIST, SCRIPTED, Measured

#: Issue 16's targets.
TARGET_BYTES = 400
TARGET_REDIS_US = 2.5
TARGET_RATE = 150_000

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
