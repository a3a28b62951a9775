"""`prq demo --spark` as a real process: a local Spark job enqueues detached requests to
poll://spark-bulk while the senders call, node S drains them, and the summary gives the job's
exact counts. Without pyspark the option fails at once with one clear line.
"""

from __future__ import annotations

import sys

import pytest
import redis
from typer.testing import CliRunner

from prq.cli import app
from prq.core.keys import KeySchema
from prq.demo.spark import SPARK_ENDPOINT, spark_unavailable
from tests.integration.test_cli import PrqRunner

pytestmark = pytest.mark.spark

#: Bounds the whole demo run (JVM start, the job, the drain, stopping).
DEMO_TIMEOUT_S = 150.0


@pytest.mark.integration
@pytest.mark.timeout(DEMO_TIMEOUT_S + 30)
def test_prq_demo_spark_enqueues_every_row_while_the_calls_go_on(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    problem = spark_unavailable()
    if problem is not None:
        pytest.skip(problem)
    # Given a Redis and a fresh key prefix, and no terminal (headless status lines)
    runner = PrqRunner(redis_url, key_prefix)

    # When the demo runs with a Spark bulk enqueue of 20,000 rows
    done = runner.run(
        "demo", "--spark", "--spark-rows", "20000", "--duration", "2", timeout_s=DEMO_TIMEOUT_S
    )

    # Then it ends by itself, successfully, once the bulk is enqueued and drained
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    # And it reported the progress on the way, and the job's exact counts at the end
    assert "spark: enqueued=" in done.stdout, output
    assert "20000 accepted, 0 duplicate, 0 rejected; 20000 drained" in done.stdout, output
    # And the interactive calls went on: the senders' summary counts calls, none failed
    assert ", 0 failed; handled by node A=" in done.stdout, output
    assert "S=20000" in done.stdout, output
    # And Redis's enqueue counter of the endpoint says 20,000
    sequence = KeySchema(key_prefix).endpoint(SPARK_ENDPOINT).sequence
    assert int(redis_client.get(sequence) or 0) == 20_000


def test_prq_demo_spark_without_pyspark_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a Python where pyspark cannot be imported
    monkeypatch.setitem(sys.modules, "pyspark", None)

    # When `prq demo --spark` runs (the URL points nowhere: nothing may be started)
    result = CliRunner().invoke(app, ["demo", "--spark", "--url", "redis://127.0.0.1:9/0"])

    # Then it exits with 2 and one line that says what to install, without a traceback
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert "needs pyspark and pyarrow" in lines[0]
    assert "pip install 'prq[spark]'" in lines[0]
    assert "`make install`" in lines[0]
    assert "Traceback" not in result.output
