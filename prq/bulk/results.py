"""What a bulk enqueue reports: its exact counts (BulkResult), the requests refused before any
write (Rejected), and the error that says an endpoint was full (BatchRefused)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prq.core.errors import PrqError, QueueFull

__all__ = ["BatchRefused", "BulkResult", "Rejected"]


@dataclass(frozen=True, slots=True)
class Rejected:
    """A request refused before anything was written, and why."""

    request_id: str
    error: PrqError


@dataclass(slots=True)
class BulkResult:
    """What `enqueue_many` did, exactly, counted from Redis's replies."""

    #: Requests queued by this call (a retried round trip is not counted twice).
    accepted: int = 0
    #: Ids that were already known (queued, running, answered, cancelled, or taken before by
    #: the ledger's account): not enqueued again.
    duplicate_ids: list[str] = field(default_factory=list)
    #: Those of duplicate_ids known only to the ledger: a receiver took them, and their records
    #: (and answers) are gone.
    expired_ids: list[str] = field(default_factory=list)
    #: Those of duplicate_ids that the same task attempt sent in another batch (TaskAttempt).
    repeated_ids: list[str] = field(default_factory=list)
    #: Those of duplicate_ids held by another request: sent with a fingerprint
    #: (`enqueue_encoded(..., fingerprints=)`) that differs from the one in the id's record
    #: (other params), so the outcome stored under the id is not theirs.
    conflict_ids: list[str] = field(default_factory=list)
    #: Requests refused before any write (an invalid endpoint, a body over max_body_bytes).
    rejected: list[Rejected] = field(default_factory=list)
    #: Each endpoint written to: its queued requests (over all priorities) after this call's
    #: last batch for it, as Redis counted them then (to hold back by: backpressure).
    depths: dict[str, int] = field(default_factory=dict)
    #: With a loss watch (`enqueue_many(..., watch=)`): it saw Redis lose data since it
    #: started (a restart without persistence, a flush, a failover to a replica that missed
    #: writes), so requests counted as accepted since then, by this call or an earlier one
    #: with the same watch, may be gone. Enqueueing the same requests again (with the same
    #: ledger) queues those that are gone and counts the others as duplicates. False without
    #: a watch.
    data_loss: bool = False

    @property
    def duplicates(self) -> int:
        return len(self.duplicate_ids)

    def add(self, other: BulkResult) -> None:
        self.accepted += other.accepted
        self.duplicate_ids += other.duplicate_ids
        self.expired_ids += other.expired_ids
        self.repeated_ids += other.repeated_ids
        self.conflict_ids += other.conflict_ids
        self.rejected += other.rejected
        self.depths |= other.depths
        self.data_loss = self.data_loss or other.data_loss


class BatchRefused(QueueFull):
    """Some new requests were not written: their endpoint was at its max_pending.

    What the batch did write is in `partial` (accepted with this nonce, so sending the same
    batch again with the same nonce counts them as accepted, not as duplicates). Retryable.
    """

    def __init__(self, partial: BulkResult, refused: dict[str, int]) -> None:
        where = ", ".join(f"{count} for {endpoint}" for endpoint, count in refused.items())
        super().__init__(
            f"{sum(refused.values())} new requests refused ({where}): the endpoint holds "
            f"max_pending queued requests; {partial.accepted} were accepted. Send the batch "
            "again later with the same nonce"
        )
        self.partial = partial
        self.refused = refused
