"""How a bulk enqueue counts and remembers the ids it sends: the batch nonce stored with each
record (so a batch sent again counts its own requests as accepted), a task's attempts
(TaskAttempt: exact counts whichever attempt succeeds), the dedup ledger that outlives the
records (Ledger), and the fingerprints that tell a request sent again from another one under
the same id (fingerprints)."""

from __future__ import annotations

import base64
import hashlib
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field

from prq.core.keys import ledger_token

__all__ = ["DEFAULT_LEDGER_TTL_S", "Ledger", "TaskAttempt", "fingerprints", "new_batch_nonce"]


def new_batch_nonce() -> str:
    """A fresh batch nonce (stored in every record the batch writes, as field `bn`): 11
    URL-safe characters, 64 random bits.

    A nonce only has to differ from those of the other batches that send the same id while its
    record lives; two such batches drawing the same one (a chance of 2**-64 per pair) would
    only count the second's copy as accepted instead of duplicate (nothing is enqueued twice:
    the record exists). A uuid4's 32 hex characters cost 21 more bytes per queued request.
    """
    return secrets.token_urlsafe(8)


def fingerprints(parts: Iterable[bytes]) -> list[bytes]:
    """The fingerprint of each part, for `BulkClient.enqueue_encoded(..., fingerprints=)`: 8
    URL-safe characters, 48 bits of its BLAKE2b hash. A part is what makes a request what it
    is, spelled the same by every run that sends it: its method and params, not its trace
    headers nor its priority or answer lifetime (prq.spark hashes a body's JSON up to its
    params' end).

    Stored in the record (12 bytes with its field name), a fingerprint lets Redis tell a
    request sent again (the same one: it joins the earlier one) from another request under
    the same id (a conflict: `BulkResult.conflict_ids`). Two different requests under one id
    share a fingerprint with a chance of 2**-48. About half a microsecond per part.
    """
    blake = hashlib.blake2b
    digests = b"".join([blake(part, digest_size=6).digest() for part in parts])
    text = base64.urlsafe_b64encode(digests)  # 6 bytes are 8 characters: no padding between
    return [text[at : at + 8] for at in range(0, len(text), 8)]


#: How long a dedup ledger remembers, by default: a week.
DEFAULT_LEDGER_TTL_S = 7 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class Ledger:
    """A dedup window that outlives the requests' records: requests enqueued with a ledger that
    a receiver took (so they ran, or may have) are remembered by it, and an enqueue with the
    same ledger never queues their ids again, even once their records and answers are gone;
    such ids come back in `BulkResult.expired_ids`. Ids no receiver took (withdrawn at their
    pickup timeout, or expired unanswered) are not remembered: they are queued afresh.

    It lives `ttl_s` after the last enqueue that names it (a week by default) and costs Redis one
    set member per request taken (its id), per endpoint, beside 12 bytes in each record. Name
    it after the logical run whose reruns it guards (e.g. a Spark job's namespace).
    """

    name: str
    ttl_s: float = DEFAULT_LEDGER_TTL_S

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a ledger needs a name")
        if not 0 < self.ttl_s < float("inf"):
            raise ValueError("a ledger's ttl_s must be positive and finite")

    def spelled(self) -> tuple[str, int]:
        """(token, TTL in ms), as enqueue_many_call takes them."""
        return ledger_token(self.name), max(1, int(self.ttl_s * 1000))


@dataclass(slots=True)
class TaskAttempt:
    """One attempt of a task that sends its requests in many batches (a Spark task), for counts
    that are exact whichever attempt succeeds, without remembering every id it sent.

    Each batch sent with it (`enqueue_encoded(..., attempt=)`) gets the nonce
    "<task>/<attempt>/<n>", stored with its records. Redis then tells apart, for an id already
    known: this very batch sent again (accepted, as before), another batch of this attempt
    (a repeat: `BulkResult.repeated_ids`, among the duplicates), an earlier attempt of the task
    (accepted: its work counts as this attempt's), and anybody else (a duplicate). `task` is
    the same for every attempt and must not contain '/'.
    """

    task: str
    attempt: str = field(default_factory=lambda: secrets.token_urlsafe(6))
    #: Batches sent so far.
    sent: int = 0

    def __post_init__(self) -> None:
        if "/" in self.task or "/" in self.attempt:
            raise ValueError("a task attempt's names must not contain '/'")

    def next_nonce(self) -> str:
        self.sent += 1
        return f"{self.task}/{self.attempt}/{self.sent}"

    def prefixes(self) -> tuple[str, str]:
        """(this attempt's nonce prefix, the task's), as enqueue_many_call takes them."""
        return f"{self.task}/{self.attempt}/", f"{self.task}/"
