"""Bulk enqueue of detached requests, and reading their outcomes, without running a node.

A *detached* request has no sender waiting on a pulse: its response is kept under its id (for
the response TTL) for whoever asks, and no sender liveness is judged, so it runs to the end even
when whoever enqueued it is gone (a Spark task that failed, say). Enqueue is idempotent by id:
a known id is never enqueued twice, whoever tries (see enqueue_many.lua), so a retried or
speculative batch with deterministic ids enqueues nothing twice.

`BulkClient` is blocking and light: one owned Redis connection (the retry policy, error
translation and script loading of the queue's own I/O), no background thread (a call of several
round trips has a helper thread wait on each while it encodes the next), no pub/sub. It
sends up to `batch_size` requests per round trip (one script call per endpoint and batch, and
the endpoints' registry entry, through which `status`/`cancel` by id find a request from any
node; each id's locator too with `QueueSettings.request_locators`) and checks every reply:
a full or failing Redis raises, it never loses requests silently.

Example:
    with BulkClient.from_url("redis://localhost:6379/0") as bulk:
        result = bulk.enqueue_many(
            Request(endpoint="poll://billing-1", method="charge", params=row, id=f"run-7:{key}")
            for key, row in rows
        )
        print(result.accepted, result.duplicates, len(result.rejected))
"""

from __future__ import annotations

from prq.bulk.client import DEFAULT_BATCH_SIZE, BulkClient
from prq.bulk.client import MAX_BATCH_SIZE as MAX_BATCH_SIZE
from prq.bulk.dedup import DEFAULT_LEDGER_TTL_S, Ledger, TaskAttempt, fingerprints
from prq.bulk.dedup import new_batch_nonce as new_batch_nonce
from prq.bulk.encode import BULK_PRODUCER as BULK_PRODUCER
from prq.bulk.encode import Lane as Lane
from prq.bulk.outcomes import TAKEN_BEFORE
from prq.bulk.results import BatchRefused, BulkResult, Rejected
from prq.bulk.watch import LossWatch

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_LEDGER_TTL_S",
    "TAKEN_BEFORE",
    "BatchRefused",
    "BulkClient",
    "BulkResult",
    "Ledger",
    "LossWatch",
    "Rejected",
    "TaskAttempt",
    "fingerprints",
]
