"""The Spark examples the README points at run as documented (plain `python`, small inputs)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from prq.core.keys import KeySchema
from tests.queued import queue_depth

pytestmark = [pytest.mark.spark, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]


def run_example(name: str, rows: int, redis_url: str, key_prefix: str) -> str:
    pytest.importorskip("pyspark")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRQ_")} | {
        "PRQ_REDIS_URL": redis_url,
        "PRQ_PREFIX": key_prefix,
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    done = subprocess.run(
        [sys.executable, f"examples/{name}", str(rows)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.timeout(240)  # (the example runs 180 s at most: a loaded host is slow)
def test_the_enqueue_example_enqueues_once_and_reports_the_rerun_as_duplicates(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    out = run_example("spark_enqueue.py", 3000, redis_url, key_prefix)
    assert re.findall(r"accepted (\d+), duplicates (\d+), rejected (\d+)", out) == [
        ("3000", "0", "0"),
        ("0", "3000", "0"),
    ]
    pending = KeySchema(key_prefix).endpoint("poll://spark-example")
    assert queue_depth(redis_client, pending) == 3000


@pytest.mark.timeout(240)  # (the example runs 180 s at most: a loaded host is slow)
def test_the_call_example_collects_every_response(redis_url: str, key_prefix: str) -> None:
    out = run_example("spark_call.py", 500, redis_url, key_prefix)
    assert re.search(r"^500 answers in ", out, re.MULTILINE), out[-2000:]
    # the error_type breakdown: customer 13 (ids 13, 113, ...) is refused by the service
    assert re.search(r"\|\s*NULL\s*\|\s*495\s*\|", out), out[-2000:]
    assert re.search(r"\|\s*PermissionError\s*\|\s*5\s*\|", out), out[-2000:]
