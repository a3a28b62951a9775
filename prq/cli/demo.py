"""`prq demo` and `prq bench`: the two commands that bring their own Redis when none is given."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from prq.cli.options import EmbeddedUrlOption, PrefixOption
from prq.demo import DEFAULT_CONCURRENCY, DEFAULT_DURATION_S, DEFAULT_PREFIX
from prq.demo.config import DEFAULT_SPARK_ROWS

__all__ = ["BENCH_NEEDS_CHECKOUT", "BENCH_SCRIPT", "bench", "demo"]

#: Where `prq bench` finds the benchmark script: the source checkout's bench/ folder (not part
#: of the installed package: from a wheel, parents[2] is site-packages, which has no bench/).
BENCH_SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "rpc.py"
#: What `prq bench` says (exit code 2) when it runs from an installed package.
BENCH_NEEDS_CHECKOUT = (
    "prq bench needs a source checkout of prq (bench/ is not installed with the package): "
    "in a clone, run `make bench` or `python -m bench.rpc`"
)


# -- demo ----------------------------------------------------------------------------------------


def demo(
    url: EmbeddedUrlOption = None,
    duration: Annotated[
        float,
        typer.Option(
            "--duration",
            envvar="PRQ_DEMO_DURATION_S",
            show_envvar=True,
            min=0,
            help="Seconds to run; 0 runs until Ctrl-C.",
        ),
    ] = DEFAULT_DURATION_S,
    concurrency: Annotated[
        int,
        typer.Option(
            "--concurrency",
            "-c",
            envvar="PRQ_DEMO_CONCURRENCY",
            show_envvar=True,
            min=1,
            help="Sender calls in flight.",
        ),
    ] = DEFAULT_CONCURRENCY,
    prefix: PrefixOption = DEFAULT_PREFIX,
    seed: Annotated[
        int | None,
        typer.Option("--seed", help="Seed the senders' random choices (repeatable runs)."),
    ] = None,
    nodes: Annotated[
        bool,
        typer.Option(
            "--nodes/--no-nodes",
            envvar="PRQ_DEMO_NODES",
            show_envvar=True,
            help="Start the two receiver nodes. --no-nodes drives the calls at workers that "
            "serve the same endpoints elsewhere, e.g. `prq worker prq.demo.handlers:handle` "
            "(docker-compose.yml does this).",
        ),
    ] = True,
    spark: Annotated[
        bool,
        typer.Option(
            "--spark/--no-spark",
            envvar="PRQ_DEMO_SPARK",
            show_envvar=True,
            help="Also run a local Spark job (pyspark, pyarrow and Java needed) that enqueues "
            "--spark-rows detached requests to poll://spark-bulk while the calls go on, with a "
            "progress bar read from Redis; a third node (S) drains them. The run lasts until "
            "the bulk is enqueued and drained (bounded).",
        ),
    ] = False,
    spark_rows: Annotated[
        int,
        typer.Option(
            "--spark-rows",
            envvar="PRQ_DEMO_SPARK_ROWS",
            show_envvar=True,
            min=1,
            help="Rows the Spark job enqueues (with --spark).",
        ),
    ] = DEFAULT_SPARK_ROWS,
    cluster: Annotated[
        bool,
        typer.Option(
            "--cluster",
            envvar="PRQ_DEMO_CLUSTER",
            show_envvar=True,
            help="With no --url: run on a local Redis Cluster of 3 masters (redis-server 7 "
            "or later needed) instead of one embedded server.",
        ),
    ] = False,
) -> None:
    """Start two receiver nodes and drive calls at them, with a live table.

    Node A serves poll://billing-1 and poll://billing-2 with AsyncQueue.serve; node B serves
    poll://search-1 and poll://search-2 with Queue.serve (worker threads). Each is its own OS
    process. Senders in this process call echo, sum, sleep and flaky (which raises now and
    then) and the table shows calls/s, p50/p99 latency, calls in flight and errors per
    endpoint, refreshed twice a second. Without a terminal it prints a status line every
    2 s and the final table. --spark adds a bulk enqueue by a local Spark job and its
    progress (exit code 2 when pyspark, pyarrow or Java is missing).
    """
    from prq.demo import DemoConfig, run_demo

    config = DemoConfig(
        url=url,
        duration_s=duration,
        concurrency=concurrency,
        prefix=prefix,
        seed=seed,
        start_nodes=nodes,
        spark=spark,
        spark_rows=spark_rows,
        cluster=cluster,
    )
    raise typer.Exit(run_demo(config))


# -- bench ---------------------------------------------------------------------------------------


def bench(
    url: EmbeddedUrlOption = None,
    calls: Annotated[
        int,
        typer.Option(
            "--calls",
            envvar="PRQ_BENCH_CALLS",
            show_envvar=True,
            min=1,
            help="Calls in the throughput phase of each variant.",
        ),
    ] = 10_000,
    seq_calls: Annotated[
        int,
        typer.Option(
            "--seq-calls",
            envvar="PRQ_BENCH_SEQ_CALLS",
            show_envvar=True,
            min=1,
            help="Calls in the sequential (latency) phase of each variant.",
        ),
    ] = 2_000,
    warmup: Annotated[
        int,
        typer.Option(
            "--warmup",
            envvar="PRQ_BENCH_WARMUP",
            show_envvar=True,
            min=0,
            help="Unmeasured calls before the phases.",
        ),
    ] = 200,
    inflight: Annotated[
        int,
        typer.Option(
            "--inflight",
            envvar="PRQ_BENCH_INFLIGHT",
            show_envvar=True,
            min=1,
            help="Calls in flight in the throughput phase (threads for the sync variants).",
        ),
    ] = 64,
    repeat: Annotated[
        int,
        typer.Option(
            "--repeat",
            envvar="PRQ_BENCH_REPEAT",
            show_envvar=True,
            min=1,
            help="Run the variants this many times, interleaved, and report medians.",
        ),
    ] = 1,
    only: Annotated[
        str | None,
        typer.Option(
            "--only",
            help="Comma-separated variants to run: raw-async, raw-sync, prq-async, prq-sync.",
        ),
    ] = None,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Print the results as a markdown table.")
    ] = False,
) -> None:
    """Measure prq against a raw redis-py list RPC on the same Redis (runs bench/rpc.py).

    Per variant: p50/p99 of sequential calls, calls/s with --inflight calls in flight, and
    Redis commands per call (sender side and server side). Prints PASS/MISS against the
    targets (prq p50 <= 2.5x baseline, throughput >= 0.5x baseline); always exits 0 once
    the measurements ran. Needs a source checkout (bench/ is not installed with the package):
    from an installed package it says so and exits 2.
    """
    if not BENCH_SCRIPT.is_file():
        typer.echo(BENCH_NEEDS_CHECKOUT, err=True)
        raise typer.Exit(2)
    argv = [
        f"--calls={calls}",
        f"--seq-calls={seq_calls}",
        f"--warmup={warmup}",
        f"--inflight={inflight}",
        f"--repeat={repeat}",
    ]
    if url is not None:
        argv.append(f"--url={url}")
    if only is not None:
        argv.append(f"--only={only}")
    if markdown:
        argv.append("--markdown")
    # Import bench.rpc as a package module (not by path) so that its spawned server processes
    # can import their entry points by name; spawn passes sys.path on to them.
    root_dir = str(BENCH_SCRIPT.parent.parent)
    if root_dir not in sys.path:
        sys.path.insert(0, root_dir)
    rpc = importlib.import_module("bench.rpc")
    with _working(f"prq bench: {repeat} run(s) of each variant, {calls} + {seq_calls} calls each"):
        code = rpc.main(argv)
    raise typer.Exit(int(code))


def _working(description: str) -> Progress:
    """A spinner with the elapsed time on stderr while the benchmark runs (terminals only;
    the lines the benchmark prints scroll above it)."""
    console = Console(stderr=True)
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
    progress.add_task(description, total=None)
    return progress
