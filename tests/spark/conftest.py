"""One local SparkSession per test module (`local[2,4]`: 2 slots, a failed task is tried up to 4
times, as on a cluster by default).

Spark's Python workers run this interpreter (PYSPARK_PYTHON), so they import the prq under test.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.integration.test_cli import Prq, PrqRunner

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17 or 21")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PYSPARK_PYTHON", sys.executable)
        env.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
        env.setenv("SPARK_LOCAL_IP", "127.0.0.1")
        session = _start_session()
        session.sparkContext.setLogLevel("ERROR")
        try:
            yield session
        finally:
            session.stop()


def _start_session() -> SparkSession:
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master("local[2,4]")
        .appName("prq-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.memory", "768m")
        .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
        # Arrow batches of 2,000 rows, so an injected failure lands in the middle of a partition
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "2000")
        .getOrCreate()
    )


@pytest.fixture
def receiver(redis_url: str, key_prefix: str, tmp_path: Path) -> Iterator[tuple[Prq, Path]]:
    """A `prq worker` process serving poll://spark-call; it records each run in a ledger
    (tests/spark/ledger_handler.py)."""
    ledger = tmp_path / "ledger.txt"
    ledger.touch()
    runner = PrqRunner(redis_url, key_prefix)
    try:
        worker = runner.start(
            "worker",
            "tests.spark.ledger_handler:record",
            "-e",
            "poll://spark-call",
            "--concurrency",
            "16",
            PRQ_TEST_LEDGER=str(ledger),
        )
        worker.wait_for_line("prq worker: serving")
        yield worker, ledger
    finally:
        runner.close()
