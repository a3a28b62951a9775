"""The demo: two receiver nodes, senders driving calls, and a live table of what happens.

Processes:

    main process ─┬─ EmbeddedRedis (only when no URL is given)
                  ├─ senders: asyncio tasks on one AsyncQueue, `concurrency` calls in flight
                  ├─ node A (spawned): AsyncQueue.serve  poll://billing-1, poll://billing-2
                  ├─ node B (spawned): Queue.serve        poll://search-1, poll://search-2
                  └─ with --spark: node S (spawned) serving poll://spark-bulk, and a thread
                     running a local Spark job that enqueues rows there (see spark.py)

Lifecycle: start Redis → start the nodes (bounded wait for "ready") → drive calls until the
duration passes or Ctrl-C → let senders finish their calls (bounded, then cancel) → stop the
nodes (stop event, bounded join, terminate, kill) → stop Redis → one summary line.

Every wait is bounded; a node that dies or hangs is reported and killed, never waited on forever.
Run it as `prq demo`; `python -m prq.demo` does the same with default options. `prq demo
--no-nodes` starts no node and drives the calls at workers elsewhere, which serve the same
endpoints with `prq worker prq.demo.handlers:handle` (as docker-compose.yml does).

Modules, in lifecycle order:

    config.py    DemoConfig and NodeSpec: what to run (defaults, the two nodes)
    services.py  the methods the nodes serve: echo, sum, sleep, flaky (no I/O)
    handlers.py  the same methods as handlers for `prq worker` (async and blocking)
    nodes.py     the receiver node processes: their entry point, start and stop
    stats.py     what the senders saw: per-endpoint windows, latency sample, percentiles
    senders.py   the load generators: asyncio tasks making random calls
    table.py     the rich live table and the headless status line
    spark.py     `--spark`: a local Spark job enqueues rows while the senders call; its progress
    run.py       run_demo: Redis, nodes, senders, screen, summary
"""

from __future__ import annotations

from prq.demo.config import (
    DEFAULT_CONCURRENCY,
    DEFAULT_DURATION_S,
    DEFAULT_PREFIX,
    DemoConfig,
    NodeSpec,
)
from prq.demo.run import run_demo

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_DURATION_S",
    "DEFAULT_PREFIX",
    "DemoConfig",
    "NodeSpec",
    "run_demo",
]
