"""`prq demo --spark`: a local Spark job enqueues detached requests while the senders call.

    run_demo ─┬─ SparkBulk thread: local[2] SparkSession → enqueue_dataframe(N rows) → stop
              ├─ node S (spawned, SPARK_NODE): AsyncQueue.serve poll://spark-bulk (drains it)
              └─ BulkProgress task: reads the endpoint (prq.ops.inspector) 4 times a second

The session starts before the live table (the JVM prints its start-up lines on stderr) and
waits for `go`, so the endpoint's enqueue counter is read before the first row lands. Progress
comes from Redis, not Spark: rows enqueued (the counter since `go`) and drained (enqueued minus
queued minus in flight); the final counts are the job's own (accepted, duplicate, rejected).
Request ids are `<namespace>:<row id>`, the namespace fresh per run. pyspark and pyarrow are
imported only in the thread; `spark_unavailable` says first what is missing (them, or Java).
Every wait is bounded; Ctrl-C cancels the job, and the session is always stopped.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import threading
import time
import uuid
from contextlib import suppress
from typing import TYPE_CHECKING

from redis.exceptions import RedisError
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from prq.core.errors import PrqError
from prq.demo.config import NodeSpec
from prq.ops.answers import EndpointInfo
from prq.ops.inspector import Inspector

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SPARK_ENDPOINT", "SPARK_NODE", "BulkProgress", "SparkBulk", "spark_unavailable"]

#: Where the Spark job's requests go, and the node that drains them.
SPARK_ENDPOINT = "poll://spark-bulk"
SPARK_NODE = NodeSpec("S", "async", (SPARK_ENDPOINT,), concurrency=32)
#: Partitions of the job's DataFrame (local[2] runs two at a time).
DEFAULT_SPARK_PARTITIONS = 4
#: Bounds: session start, the job itself, draining after the job, stopping Spark, one read.
DEFAULT_SPARK_START_TIMEOUT_S = 120.0
DEFAULT_SPARK_JOB_TIMEOUT_S = 600.0
DEFAULT_SPARK_DRAIN_WAIT_S = 120.0
DEFAULT_SPARK_STOP_TIMEOUT_S = 30.0
DEFAULT_READ_TIMEOUT_S = 1.0
#: How often the progress reads the endpoint from Redis.
DEFAULT_POLL_INTERVAL_S = 0.25
#: How long a bulk request may wait for node S (it drains them while the job still adds).
DEFAULT_BULK_PICKUP_TIMEOUT_S = 900.0
#: The session: two cores, no UI, no console progress, everything on the loopback.
SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    "spark.sql.shuffle.partitions": "2",
}


def spark_unavailable() -> str | None:
    """Why `prq demo --spark` cannot run here (one line), or None."""
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        return (
            f"prq demo --spark needs pyspark and pyarrow ({exc}): pip install 'prq[spark]' "
            "(or `make install` in a clone of prq)"
        )
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "prq demo --spark needs Java 17 or 21: put java on the PATH or set JAVA_HOME"
    return None


def _start_session() -> SparkSession:
    from pyspark.sql import SparkSession

    # Spark's Python workers must import this prq: they run this interpreter.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master("local[2]").appName("prq-demo")
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


class SparkBulk:
    """The Spark job, in a thread: start a session, wait for `go`, enqueue `rows` rows, stop.

    After the job, `counts` holds (accepted, duplicate, rejected), or `error` says why it
    failed; `stop()` cancels a running job and joins the thread (bounded).
    """

    def __init__(self, url: str, prefix: str, rows: int) -> None:
        self.url = url
        self.prefix = prefix
        self.rows = rows
        self.namespace = f"demo-{uuid.uuid4().hex[:8]}"
        self.counts: tuple[int, int, int] | None = None
        self.error: str | None = None
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self._session: SparkSession | None = None
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._go = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prq-demo-spark", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wait_ready(self, timeout_s: float = DEFAULT_SPARK_START_TIMEOUT_S) -> str | None:
        """Wait until the session runs; why it does not (one line), or None."""
        deadline = time.monotonic() + timeout_s
        try:
            while not self._ready.wait(0.1):
                if not self._thread.is_alive():
                    return self.error or "the Spark thread ended"
                if time.monotonic() > deadline:
                    return f"no Spark session within {timeout_s:g} s"
        except KeyboardInterrupt:
            return "interrupted (Ctrl-C)"
        return None

    def go(self) -> None:
        self.started_at = time.monotonic()
        self._go.set()

    def stop(self, timeout_s: float = DEFAULT_SPARK_STOP_TIMEOUT_S) -> None:
        """Cancel the job if it still runs, and wait (bounded) until the session stopped."""
        if not self._thread.is_alive():
            return
        self._stopping.set()
        self._go.set()
        with self._lock:
            session = self._session
        if session is not None:
            with suppress(Exception):
                session.sparkContext.cancelAllJobs()
        self._thread.join(timeout_s)
        if self._thread.is_alive() and session is not None:
            with suppress(Exception):
                session.stop()
            self._thread.join(5.0)

    def _run(self) -> None:
        session: SparkSession | None = None
        try:
            session = _start_session()
            with self._lock:
                self._session = session
            self._ready.set()
            if self._go.wait(DEFAULT_SPARK_START_TIMEOUT_S) and not self._stopping.is_set():
                self.counts = self._enqueue(session)
        except Exception as exc:
            if not self._stopping.is_set():
                first = (str(exc).strip().splitlines() or [""])[0][:200]
                self.error = f"{type(exc).__name__}: {first}"
        finally:
            self.ended_at = time.monotonic()
            with self._lock:
                self._session = None
            if session is not None:
                with suppress(Exception):
                    session.stop()

    def _enqueue(self, session: SparkSession) -> tuple[int, int, int]:
        from prq.spark import SparkQueueConfig, enqueue_dataframe

        cfg = SparkQueueConfig(
            url=self.url,
            endpoint=SPARK_ENDPOINT,
            method="echo",
            namespace=self.namespace,
            key_column="key",
            prefix=self.prefix,
            pickup_timeout_s=DEFAULT_BULK_PICKUP_TIMEOUT_S,
        )
        df = session.range(0, self.rows, numPartitions=DEFAULT_SPARK_PARTITIONS)
        df = df.selectExpr("id AS key", "id % 1000 AS n")
        rows = enqueue_dataframe(df, cfg).collect()
        return (
            sum(int(r["accepted"]) for r in rows),
            sum(int(r["duplicate"]) for r in rows),
            sum(int(r["rejected"]) for r in rows),
        )


class BulkProgress:
    """Rows enqueued and drained, read from Redis by a task of its own (so a slow read never
    holds the screen up): a rich Progress drawn inside the demo's Live (never started on its
    own), a status line when headless, and a summary at the end."""

    def __init__(self, bulk: SparkBulk, inspector: Inspector) -> None:
        self.bulk = bulk
        self.inspector = inspector
        self.baseline = 0
        self.enqueued = 0
        self.drained = 0
        self.timed_out = False
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(),
            auto_refresh=False,
        )
        self._enqueued = self.progress.add_task(f"spark → {SPARK_ENDPOINT}", total=bulk.rows)
        self._drained = self.progress.add_task("drained by receivers", total=bulk.rows)
        self._poller: asyncio.Task[None] | None = None
        self._finished = False

    async def begin(self) -> None:
        """Read the endpoint's counter (earlier runs count there too), let the job go, poll."""
        info = await self._read()
        self.baseline = info.enqueued_total if info is not None else 0
        self.bulk.go()
        for task in (self._enqueued, self._drained):
            self.progress.reset(task)
        self._poller = asyncio.create_task(self._poll(), name="prq-demo-spark-progress")

    async def finish(self) -> None:
        """Cancel the job if it still runs, stop Spark (bounded), read the figures once more,
        stop polling."""
        if self._finished:
            return
        self._finished = True
        await asyncio.to_thread(self.bulk.stop)
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.wait([self._poller], timeout=DEFAULT_READ_TIMEOUT_S)
        await self._refresh()

    async def _poll(self) -> None:
        while True:
            await self._refresh()
            await asyncio.sleep(DEFAULT_POLL_INTERVAL_S)

    async def _refresh(self) -> None:
        info = await self._read()
        if info is not None:
            self.enqueued = min(self.bulk.rows, max(0, info.enqueued_total - self.baseline))
            left = info.depth + info.in_flight
            self.drained = max(self.drained, min(self.enqueued, self.enqueued - left))
        self.progress.update(self._enqueued, completed=self.enqueued, description=self._state())
        self.progress.update(self._drained, completed=self.drained)

    def settled(self) -> bool:
        """True once the demo may end: the job ended and its requests were drained (or they
        were not within DEFAULT_SPARK_DRAIN_WAIT_S), or the job ran too long."""
        bulk, now = self.bulk, time.monotonic()
        if bulk.ended_at is None:
            self.timed_out = now - (bulk.started_at or now) > DEFAULT_SPARK_JOB_TIMEOUT_S
            return self.timed_out
        if bulk.counts is None:
            return True
        return self.drained >= bulk.counts[0] or now - bulk.ended_at > DEFAULT_SPARK_DRAIN_WAIT_S

    @property
    def failed(self) -> bool:
        return self.bulk.error is not None or self.timed_out

    @property
    def phase(self) -> str:
        """running, done, failed or cancelled (stopped before it ended: Ctrl-C)."""
        if self.bulk.counts is not None or self.failed:
            return "done" if self.bulk.counts is not None else "failed"
        return "running" if self.bulk.ended_at is None else "cancelled"

    def _state(self) -> str:
        phase = {"done": " [green]done[/green]", "failed": " [red]failed[/red]", "running": ""}
        return f"spark → {SPARK_ENDPOINT}" + phase.get(self.phase, f" {self.phase}")

    def status_line(self) -> str:
        done = f"{self.enqueued}/{self.bulk.rows}"
        return f"spark: enqueued={done} drained={self.drained} job={self.phase}"

    def summary(self) -> str:
        bulk = self.bulk
        took = (bulk.ended_at or 0.0) - (bulk.started_at or 0.0)
        if bulk.counts is not None:
            accepted, duplicate, rejected = bulk.counts
            rate = bulk.rows / took if took > 0 else 0.0
            return (
                f"prq demo --spark: {bulk.rows} rows enqueued to {SPARK_ENDPOINT} in {took:.1f} s "
                f"({rate:.0f} rows/s): {accepted} accepted, {duplicate} duplicate, "
                f"{rejected} rejected; {self.drained} drained"
            )
        if bulk.error is not None:
            return f"prq demo --spark: the Spark job failed: {bulk.error}"
        why = f"it ran over {DEFAULT_SPARK_JOB_TIMEOUT_S:g} s" if self.timed_out else "Ctrl-C"
        return (
            f"prq demo --spark: the Spark job was cancelled ({why}); {self.enqueued} "
            f"of {bulk.rows} rows had reached Redis, {self.drained} drained"
        )

    async def _read(self) -> EndpointInfo | None:
        """The endpoint as Redis sees it; None when Redis does not answer within the bound (a
        read that overruns is cancelled, never waited for)."""
        read = asyncio.create_task(self.inspector.endpoint(SPARK_ENDPOINT))
        done, _ = await asyncio.wait([read], timeout=DEFAULT_READ_TIMEOUT_S)
        if not done:
            read.cancel()
            return None
        try:
            return read.result()
        except (PrqError, RedisError, OSError):
            return None
