"""What the demo runs: its options (DemoConfig) and its receiver nodes (NodeSpec, NODES)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_DURATION_S",
    "DEFAULT_PREFIX",
    "DEFAULT_SPARK_ROWS",
    "NODES",
    "DemoConfig",
    "Facade",
    "NodeSpec",
]

#: How long the demo runs when not told otherwise (0 means until Ctrl-C).
DEFAULT_DURATION_S = 10.0
#: Sender calls in flight.
DEFAULT_CONCURRENCY = 32
#: Key prefix of the demo's queue.
DEFAULT_PREFIX = "prq"
#: Rows the Spark job of `prq demo --spark` enqueues.
DEFAULT_SPARK_ROWS = 200_000

Facade = Literal["async", "sync"]


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One receiver node: a process serving `endpoints` with one facade."""

    name: str
    facade: Facade
    endpoints: tuple[str, ...]
    concurrency: int


#: The two receiver nodes of the demo.
NODES: tuple[NodeSpec, ...] = (
    NodeSpec("A", "async", ("poll://billing-1", "poll://billing-2"), concurrency=16),
    NodeSpec("B", "sync", ("poll://search-1", "poll://search-2"), concurrency=8),
)


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """What `run_demo` needs; `url` None starts an embedded Redis.

    `start_nodes` False starts no receiver node: the senders call the nodes' endpoints all the
    same, for workers elsewhere (`prq worker prq.demo.handlers:handle`) to serve.

    `spark` True also runs a local Spark job that enqueues `spark_rows` detached requests to
    poll://spark-bulk while the senders call (see prq.demo.spark).
    """

    url: str | None = None
    duration_s: float = DEFAULT_DURATION_S
    concurrency: int = DEFAULT_CONCURRENCY
    prefix: str = DEFAULT_PREFIX
    nodes: tuple[NodeSpec, ...] = NODES
    seed: int | None = None
    start_nodes: bool = True
    spark: bool = False
    spark_rows: int = DEFAULT_SPARK_ROWS
    #: With no `url`: start a local Redis Cluster of 3 masters instead of one server.
    cluster: bool = False
