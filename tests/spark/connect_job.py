"""prq.spark under Spark Connect, run by test_connect.py in a process of its own.

`SparkSession.builder.remote("local[2]")` starts a local Spark Connect server and returns a
Connect client session (no `df.rdd`, no `_jdf`): what a user on Databricks or a Connect
cluster has. The job enqueues 4,000 rows with enqueue_dataframe and calls 300 with
call_dataframe (against the worker the test runs), then prints what it got as one JSON line.

    python -m tests.spark.connect_job <redis url> <key prefix> <namespace>
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace


def main(url: str, prefix: str, namespace: str) -> None:
    from pyspark.sql import SparkSession

    from prq.spark import (
        SparkQueueConfig,
        call_dataframe,
        enqueue_dataframe,
        register_data_source,
    )

    spark = (
        SparkSession.builder.remote("local[2]")
        .appName("prq-spark-connect-test")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    try:
        df = spark.range(0, 4000, numPartitions=2).selectExpr("id AS key", "id AS n")
        cfg = SparkQueueConfig(
            url=url, prefix=prefix, endpoint="poll://spark-connect", method="square",
            namespace=namespace, key_column="key",
        )  # fmt: skip
        counts = [list(row) for row in enqueue_dataframe(df, cfg).collect()]
        call_cfg = replace(cfg, endpoint="poll://spark-call", namespace=f"{namespace}-call")
        called = call_dataframe(df.limit(300), call_cfg, result_schema="n long, squared long")
        # (the typed result, and the key to join back by, flattened into plain values)
        answers = [
            [*row[:6], row.result.squared if row.result is not None else None]
            for row in called.collect()
        ]
        register_data_source(spark)
        written = spark.range(0, 500, numPartitions=2).selectExpr("id AS key", "id AS n")
        written.write.format("prq").mode("append").options(
            url=url, prefix=prefix, endpoint="poll://spark-connect-source", method="square",
            namespace=namespace, key_column="key",
        ).save()  # fmt: skip
        session = f"{type(spark).__module__}.{type(spark).__name__}"
        print(json.dumps({"session": session, "counts": counts, "answers": answers}))
    finally:
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
