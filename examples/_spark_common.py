"""Shared set-up of the Spark examples: a Redis (PRQ_REDIS_URL, else an embedded one) and a
SparkSession (the one spark-submit configured, else local[2])."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@contextlib.contextmanager
def redis_url() -> Iterator[str]:
    """PRQ_REDIS_URL when set, else a private redis-server for the example's run."""
    url = os.environ.get("PRQ_REDIS_URL")
    if url:
        yield url
        return
    from prq.embedded import EmbeddedRedis

    server = EmbeddedRedis().start()
    try:
        print(f"using an embedded Redis at {server.url} (set PRQ_REDIS_URL to use yours)")
        yield server.url
    finally:
        server.cleanup()


def spark_session(app: str) -> SparkSession:
    """The session spark-submit set up, or a local one (2 slots) under plain `python`."""
    from pyspark.sql import SparkSession

    # Spark's Python workers must import prq: run them with this interpreter.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app)
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # plain `python`, not spark-submit
        builder = (
            builder.master("local[2]")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
        )
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
