"""Call-and-collect from PySpark: send each row as a request, get a DataFrame of responses.

Run with plain Python or spark-submit (needs `pip install 'prq[spark]'` and Java 17 or 21):

    python examples/spark_call.py [ROWS]
    spark-submit --master 'local[2]' examples/spark_call.py [ROWS]

Uses the Redis at PRQ_REDIS_URL (and PRQ_PREFIX) when set, else an embedded one. The service is
`handler` below, served in this process by a background thread; with PRQ_EXTERNAL_RECEIVER=1
it is left to a worker of yours, e.g.

    prq worker examples.spark_call:handler -e poll://spark-example-call -c 8

Each task keeps at most `max_in_flight` requests unanswered. The result is persisted: every
action on an unpersisted result reads the outcomes again (nothing runs twice on the service,
the responses are stored under the deterministic request ids, but the reads cost time).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _spark_common import redis_url, spark_session

from prq import Queue, Request
from prq.spark import SparkQueueConfig, call_dataframe

ENDPOINT = "poll://spark-example-call"


def handler(request: Request) -> object:
    """The service: a price with tax; customer 13 is refused."""
    params = request.params if isinstance(request.params, dict) else {}
    if params.get("customer") == 13:
        raise PermissionError("customer 13 is blocked")
    given = params.get("amount")
    amount = float(given) if isinstance(given, int | float | str) else 0.0
    return {"with_tax": round(amount * 1.2, 2)}


def main(rows: int) -> None:
    prefix = os.environ.get("PRQ_PREFIX", "prq")
    with redis_url() as url:
        stop = threading.Event()
        receiver = None
        if not os.environ.get("PRQ_EXTERNAL_RECEIVER"):
            queue = Queue.from_url(url, prefix=prefix)
            queue.start()
            receiver = threading.Thread(
                target=queue.serve,
                args=(ENDPOINT, handler),
                kwargs={"concurrency": 8, "stop": stop},
                daemon=True,
            )
            receiver.start()
        spark = spark_session("prq-spark-call")
        try:
            df = spark.range(0, rows, numPartitions=2).selectExpr(
                "id AS order_id", "id % 100 AS customer", "round(rand(7) * 100, 2) AS amount"
            )
            cfg = SparkQueueConfig(
                url=url,
                prefix=prefix,
                endpoint=ENDPOINT,
                method="price",
                namespace=f"example-call:{int(time.time())}",
                key_column="order_id",
                max_in_flight=1000,
            )
            started = time.perf_counter()
            answers = call_dataframe(df, cfg).persist()
            n = answers.count()
            print(f"{n} answers in {time.perf_counter() - started:.2f} s")
            answers.orderBy("request_id").show(5, truncate=False)
            answers.groupBy("error_type").count().show()
            answers.unpersist()
        finally:
            spark.stop()
            stop.set()
            if receiver is not None:
                receiver.join(10)
                queue.close()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000)
