"""Scenario 26: a bulk job (BulkClient.enqueue_many with a loss watch, as a Spark task writes)
across two losses in a row, a flush and then a restart empty, while workers of both facades
serve its endpoint. Every request the job writes after a loss runs, once, whether it was
written before the loss was declared or after (at 16362ce most of those written between a
flush and its declaration were refused as queued before it, and never ran); and the job is
told that Redis lost data while it wrote (issue 39, item 6)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
import redis

from prq import Request
from prq.bulk import BulkClient, LossWatch
from prq.embedded import EmbeddedRedis
from tests.fault.nodes import NodeFactory, NodeProcess
from tests.fault.redis_faults import flushall, restart_empty
from tests.fault.scenarios import ENDPOINT, data_loss_declared, figures
from tests.fault.timings import fault_settings
from tests.redis_servers import wait_until

pytestmark = pytest.mark.fault

#: The job: this many requests, this many a round trip; Redis is flushed when the job reaches
#: the first mark, and restarted empty at the second, once the flush was declared and the
#: requests written after it ran (so that the restart takes none of those).
JOB, BATCH = 3000, 100
FLUSH_AT, RESTART_AT = 1000, 2000


def _ran(receivers: list[NodeProcess]) -> Counter[str]:
    """How often each request started on a worker (the workers' ledgers)."""
    return Counter(
        record["id"]
        for node in receivers
        for record in node.ledger()
        if record.get("event") == "start"
    )


@pytest.mark.timeout(120)
def test_a_bulk_job_across_a_flush_and_a_restart_runs_what_it_wrote_after_each(
    nodes: NodeFactory, fault_redis: EmbeddedRedis, fault_client: redis.Redis, fault_prefix: str
) -> None:
    # Given a worker of each facade serving the endpoint
    receivers = [
        nodes.receiver(f"r-{facade}", facade=facade, concurrency=8) for facade in ("async", "sync")
    ]
    ids = [f"job:{n}" for n in range(JOB)]
    # (what the job has sent when it reads a request: the batches before the one it fills,
    # but for one maybe, sent as it fills the next)
    after_flush = set(ids[FLUSH_AT : RESTART_AT - 2 * BATCH])

    # When a bulk job writes its requests, Redis flushed at one point and restarted empty at
    # another (the job writing on, never waiting for the losses to be declared)
    def job() -> Iterator[Request]:
        for n, rid in enumerate(ids):
            if n == FLUSH_AT:
                flushall(fault_redis)
            elif n == RESTART_AT:
                wait_until(
                    lambda: after_flush <= set(_ran(receivers)),
                    30,
                    0.05,
                    "every request written after the flush ran",
                )
                wait_until(
                    lambda: all(data_loss_declared(node) for node in receivers),
                    10,
                    0.05,
                    "the flush declared",
                )
                restart_empty(fault_redis)
            yield Request(id=rid, endpoint=ENDPOINT, method="echo", params=n)

    with BulkClient.from_url(
        fault_redis.url, settings=fault_settings(), prefix=fault_prefix
    ) as bulk:
        result = bulk.enqueue_many(job(), batch_size=BATCH, pickup_timeout_s=60, watch=LossWatch())

    # Then the job counts every request accepted and says that Redis lost data meanwhile
    assert (result.accepted, result.data_loss) == (JOB, True)
    # And every request written after the restart runs too; none runs twice
    after_restart = set(ids[RESTART_AT:])
    wait_until(
        lambda: after_restart <= set(_ran(receivers)),
        30,
        0.05,
        "every request written after the restart ran",
    )
    ran = _ran(receivers)
    for node in receivers:
        assert node.stop() == 0
    assert not [rid for rid, times in ran.items() if times > 1], "a request ran twice"
    # And both losses were declared, by both workers
    declared = [len(data_loss_declared(node)) for node in receivers]
    figures(
        "S26",
        declarations_per_worker=declared,
        lost_to_the_flush=sum(1 for rid in ids[:FLUSH_AT] if rid not in ran),
        ran=len(ran),
    )
    assert all(n >= 2 for n in declared), declared
