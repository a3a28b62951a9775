"""Bulk enqueue from PySpark: every row of a DataFrame becomes one prq request, exactly once.

Run with plain Python or spark-submit (needs `pip install 'prq[spark]'` and Java 17 or 21):

    python examples/spark_enqueue.py [ROWS]
    spark-submit --master 'local[2]' examples/spark_enqueue.py [ROWS]

Uses the Redis at PRQ_REDIS_URL (and PRQ_PREFIX) when set, else an embedded one. Serve the
requests with e.g. `prq worker mymodule:score -e poll://spark-example`.

Request ids are "<namespace>:<order_id>", so running the enqueue again (a retried task, a
rerun of the job with the same run id) enqueues nothing twice: the second pass below reports
every row as a duplicate.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _spark_common import redis_url, spark_session

from prq.spark import SparkQueueConfig, enqueue_dataframe


def main(rows: int) -> None:
    with redis_url() as url:
        spark = spark_session("prq-spark-enqueue")
        try:
            df = spark.range(0, rows, numPartitions=4).selectExpr(
                "id AS order_id", "id % 100 AS customer", "round(rand(7) * 100, 2) AS amount"
            )
            cfg = SparkQueueConfig(
                url=url,
                prefix=os.environ.get("PRQ_PREFIX", "prq"),
                endpoint="poll://spark-example",
                method="score",
                namespace=f"example-enqueue:{int(time.time())}",  # the job's run id
                key_column="order_id",
            )
            for attempt in ("first pass", "second pass (a rerun)"):
                started = time.perf_counter()
                counts = enqueue_dataframe(df, cfg)
                elapsed = time.perf_counter() - started
                print(f"{attempt}: {elapsed:.2f} s")
                counts.show()
                total = counts.groupBy().sum("accepted", "duplicate", "rejected").first()
                assert total is not None
                print(f"accepted {total[0]}, duplicates {total[1]}, rejected {total[2]}")
        finally:
            spark.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
