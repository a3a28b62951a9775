"""bench/rpc.py's report: the results table, the targets (PASS/MISS), the CPU time and
per-command breakdowns, as rich tables or markdown.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass

import redis
from redis.utils import HIREDIS_AVAILABLE
from rich.console import Console
from rich.table import Table

from bench.rpc_measures import Options, Summary

#: A prq variant is compared with the raw one of its facade.
BASELINE_OF = {"prq-async": "raw-async", "prq-sync": "raw-sync"}
#: Targets: prq p50 at most this many times the baseline's; throughput at least this share;
#: Redis commands per call (those inside scripts included) at most this many, and Redis CPU
#: per call at most the baseline's (in the throughput phase).
TARGET_P50_RATIO = 2.0
TARGET_THROUGHPUT_RATIO = 1.0
TARGET_COMMANDS_PER_CALL = 12
TARGET_REDIS_CPU_RATIO = 1.0


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
