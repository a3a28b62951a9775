"""prq.spark's mapInArrow functions work under Spark Connect (a local Connect server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis

from prq.core.keys import KeySchema
from tests.integration.test_cli import Prq
from tests.queued import queue_depth

pytestmark = [pytest.mark.spark, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)  # (the job's own bound is 240 s: a loaded host starts Connect slowly)
def test_enqueue_and_call_work_through_a_spark_connect_session(
    redis_url: str,
    key_prefix: str,
    redis_client: redis.Redis,
    receiver: tuple[Prq, Path],
) -> None:
    pytest.importorskip("pyspark.sql.connect.session")
    for module in ("grpc", "pandas", "pyarrow"):
        pytest.importorskip(module)
    # Given a job that uses a Connect client session, in its own process (a process holds one
    # Spark driver, and the other Spark tests have theirs)
    namespace = f"connect-{uuid.uuid4().hex[:6]}"
    env = os.environ | {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    # When it enqueues 4,000 rows, calls 300 and writes 500 to the prq data source
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark.connect_job", redis_url, key_prefix, namespace],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])

    # Then it ran on a Connect session, the counts are exact and Redis holds every request
    assert report["session"] == "pyspark.sql.connect.session.SparkSession"
    assert sorted(row[0] for row in report["counts"]) == [0, 1]
    assert sum(row[1] for row in report["counts"]) == 4000
    assert sum(row[2] + row[3] for row in report["counts"]) == 0
    pending = KeySchema(key_prefix).endpoint("poll://spark-connect")
    assert queue_depth(redis_client, pending) == 4000
    # And every called row has its answer: a result, or the handler's error for multiples of 7
    answers = {row[0]: row[1:] for row in report["answers"]}
    assert len(answers) == 300
    for n in range(300):
        result, error, _, ran, key, squared = answers[f"{namespace}-call:{n}"]
        assert ran is True  # (maybe_executed: a receiver took it)
        assert key == n  # (the row's key, with its type, to join back by)
        if n % 7 == 0:
            assert (result, error, squared) == (None, "ValueError", None)
        else:
            assert json.loads(result) == {"n": n, "squared": n * n}
            assert squared == n * n  # (the typed result)
    _, ledger = receiver
    assert len(ledger.read_text().splitlines()) == 300
    # And the rows written to the prq data source are queued, once each
    written = KeySchema(key_prefix).endpoint("poll://spark-connect-source")
    assert queue_depth(redis_client, written) == 500
