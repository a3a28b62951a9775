"""What the demo shows: the rich live table (one row per endpoint, a total row) and the
one-line status printed instead when there is no terminal.

Rates and percentiles are over the last `DEFAULT_WINDOW_S` seconds of each `EndpointStats`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich import box
from rich.table import Table

from prq.demo.stats import DEFAULT_WINDOW_S, EndpointStats, percentile

__all__ = ["fmt_ms", "render_table", "status_line"]


def fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


@dataclass(frozen=True, slots=True)
class _Row:
    endpoint: str
    node: str
    calls: int
    rate: float
    p50: float | None
    p99: float | None
    in_flight: int
    errors: int
    failed: int


def _rows(stats: dict[str, EndpointStats], elapsed_s: float) -> tuple[list[_Row], _Row]:
    now = time.monotonic()
    span = max(1e-3, min(DEFAULT_WINDOW_S, elapsed_s))
    rows: list[_Row] = []
    everything: list[float] = []
    for name in sorted(stats):
        s = stats[name]
        s.trim(now)
        latencies = sorted(latency for _, latency in s.recent)
        everything.extend(latencies)
        rows.append(
            _Row(
                name,
                s.node,
                s.calls,
                len(latencies) / span,
                percentile(latencies, 0.50),
                percentile(latencies, 0.99),
                s.in_flight,
                s.errors,
                s.failed,
            )
        )
    everything.sort()
    total = _Row(
        "total",
        "",
        sum(r.calls for r in rows),
        sum(r.rate for r in rows),
        percentile(everything, 0.50),
        percentile(everything, 0.99),
        sum(r.in_flight for r in rows),
        sum(r.errors for r in rows),
        sum(r.failed for r in rows),
    )
    return rows, total


def render_table(stats: dict[str, EndpointStats], elapsed_s: float, title: str) -> Table:
    """The live table: one row per endpoint and a total row."""
    rows, total = _rows(stats, elapsed_s)
    table = Table(
        title=title,
        caption=(
            f"calls/s, p50, p99: last {DEFAULT_WINDOW_S:g} s · errors: the service raised "
            "(flaky on purpose) · failed: prq could not complete the call"
        ),
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1, 0, 0),
    )
    table.add_column("endpoint (node)", no_wrap=True)
    for header in ("calls", "calls/s", "p50\nms", "p99\nms", "in\nflight", "errors", "failed"):
        table.add_column(header, justify="right", no_wrap=True)
    for row in [*rows, total]:
        table.add_row(
            f"{row.endpoint} ({row.node})" if row.node else row.endpoint,
            str(row.calls),
            f"{row.rate:.0f}",
            fmt_ms(row.p50),
            fmt_ms(row.p99),
            str(row.in_flight),
            str(row.errors),
            f"[red]{row.failed}[/red]" if row.failed else "0",
            style="bold" if row is total else None,
            end_section=row is rows[-1] if rows else False,
        )
    return table


def status_line(stats: dict[str, EndpointStats], elapsed_s: float) -> str:
    _, total = _rows(stats, elapsed_s)
    return (
        f"t={elapsed_s:5.1f}s calls={total.calls} calls/s={total.rate:.0f} "
        f"p50={fmt_ms(total.p50)}ms p99={fmt_ms(total.p99)}ms in_flight={total.in_flight} "
        f"errors={total.errors} failed={total.failed}"
    )
