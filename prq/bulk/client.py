"""BulkClient: bulk enqueue of detached requests and reading their outcomes (see prq.bulk),
made of its parts: encoding (prq.bulk.encode), the round trip (prq.bulk.send) and the reads
(prq.bulk.outcomes). This module owns the enqueue calls: the batches, their overlap with the
round trip in flight, and the tracing of the call."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import islice

from prq.bulk.dedup import Ledger, TaskAttempt, new_batch_nonce
from prq.bulk.encode import BULK_PRODUCER, BulkEncoding, Encoded
from prq.bulk.outcomes import OutcomeReading
from prq.bulk.results import BulkResult
from prq.bulk.send import BulkSending
from prq.bulk.watch import LossWatch
from prq.core.bounds import call_duration
from prq.core.models import Delivery, Request
from prq.core.names import validate_endpoint
from prq.observe import tracing
from prq.protocol.levels import levels_call, levels_from

__all__ = ["DEFAULT_BATCH_SIZE", "MAX_BATCH_SIZE", "BulkClient"]

#: Requests per round trip (the measured sweet spot: larger batches gain little).
DEFAULT_BATCH_SIZE = 1000
#: Most requests in one script call (Lua's unpack limit is far above; keeps Redis responsive).
MAX_BATCH_SIZE = 5000


class BulkClient(BulkEncoding, BulkSending, OutcomeReading):
    """Enqueues detached requests in batches and reads their outcomes (blocking)."""

    def enqueue_many(
        self,
        requests: Iterable[Request],
        *,
        pickup_timeout_s: float | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        nonce: str | None = None,
        ledger: Ledger | None = None,
        retry_failed: bool = False,
        watch: LossWatch | None = None,
    ) -> BulkResult:
        """Enqueue detached requests, `batch_size` per round trip; idempotent by request id
        (while a request's record lives; with a `ledger`, also for ids a receiver took before,
        after their records are gone: see Ledger). `retry_failed`: an id whose record says it
        ended without an answer for a reason worth another try (DataLoss, ReceiverLost, a
        receiver shut down, at_least_once attempts used up) is enqueued afresh, as one whose
        record is gone or was withdrawn is (it may run again if it ran before).

        `nonce` names the sender of these requests across retries (e.g. a Spark task: its run
        and partition, the same for every attempt): ids that an earlier call with the same
        nonce enqueued count as accepted again, not as duplicates, so the counts of the attempt
        that succeeds are exact. Default: a fresh nonce per round trip (`new_batch_nonce`).
        Round trips go one at a time, in order; the next batch is encoded while one is in
        flight.

        `watch` (a LossWatch, on the first request's endpoint unless started elsewhere): every
        round trip steps it after its writes (the first also starts it before them when it is
        not started), so `result.data_loss` says whether Redis lost data since it started: the
        requests accepted since may be gone, and sending them again (with the same ledger)
        queues exactly those. One command more per round trip, no round trip more. Pass the
        same watch to the calls of one job.

        Raises QueueUnavailable (Redis away past the retry budget; `maybe_executed` once a
        batch was sent: its requests may be queued, and run), QueueFull (Redis out of memory)
        or ConfigurationError; what was sent before stays enqueued, and sending the same
        requests again enqueues only what is missing.

        Called in a traced span (prq.observe.tracing), the call is one PRODUCER span, whose context
        every request carries in its headers (unless it names its own traceparent).
        """
        trace, traced = tracing.sending_batch()
        with traced:
            result = self._enqueue_many(
                requests, pickup_timeout_s, batch_size, nonce, ledger, retry_failed, trace, watch
            )
            if watch is not None:
                result.data_loss = watch.lost
            traced.count(result.accepted + result.duplicates + len(result.rejected))
            return result

    def _enqueue_many(
        self,
        requests: Iterable[Request],
        pickup_timeout_s: float | None,
        batch_size: int,
        nonce: str | None,
        ledger: Ledger | None,
        retry_failed: bool,
        trace: dict[str, str],
        watch: LossWatch | None,
    ) -> BulkResult:
        if not 1 <= batch_size <= MAX_BATCH_SIZE:
            raise ValueError(f"batch_size must be within 1..{MAX_BATCH_SIZE}")
        pickup = self._pickup_timeout(pickup_timeout_s)
        locators = self.settings.request_locators
        total = BulkResult()

        def sent(encoded: Encoded) -> BulkResult:  # one round trip, with a fresh nonce if unset
            return self._sent(
                encoded, pickup, nonce or new_batch_nonce(), locators, ledger, retry_failed, watch
            )

        batches = _chunks(iter(requests), batch_size)
        batch = next(batches, None)
        if batch is None:
            return total
        encoded = self._encode_batch(batch, trace)
        try:
            batch = next(batches, None)
        except Exception:  # what the requests raise comes after the batches read before it
            sent(encoded)
            raise
        if batch is None:  # one round trip: nothing to overlap with
            total.add(sent(encoded))
            return total
        # Several round trips: the next batch is read and encoded while the previous one is in
        # flight (its thread waits on Redis), and sent only once that one has succeeded: one
        # round trip at a time, in order, each with its own nonce, and the first error stops
        # the call, as without the overlap. The requests are read at most a batch ahead.
        with ThreadPoolExecutor(1, thread_name_prefix="prq-bulk-send") as sender:
            while True:
                in_flight: Future[BulkResult] = sender.submit(sent, encoded)
                if batch is None:
                    total.add(in_flight.result())
                    return total
                try:
                    encoded = self._encode_batch(batch, trace)
                except Exception:
                    in_flight.result()  # its error first, as if nothing had been read after it
                    raise
                try:
                    batch = next(batches, None)
                except Exception:  # as above: the batches read before it are sent first
                    in_flight.result()
                    sent(encoded)
                    raise
                total.add(in_flight.result())

    def _pickup_timeout(self, pickup_timeout_s: float | None) -> float:
        if pickup_timeout_s is None:
            return self.settings.pickup_timeout_s
        return call_duration("pickup_timeout_s", pickup_timeout_s)

    def enqueue_encoded(
        self,
        endpoint: str,
        items: Sequence[tuple[str, str | bytes]],
        *,
        pickup_timeout_s: float | None = None,
        nonce: str | None = None,
        locators: bool | None = None,
        priority: int = 0,
        producer: str = BULK_PRODUCER,
        delivery: Delivery = "at_most_once",
        ledger: Ledger | None = None,
        retry_failed: bool = False,
        attempt: TaskAttempt | None = None,
        fingerprints: Sequence[bytes] | None = None,
        watch: LossWatch | None = None,
    ) -> BulkResult:
        """Enqueue requests already encoded, in one round trip: (id, body) pairs for `endpoint`,
        queued at `priority` in `producer`'s turns with `delivery` (the bodies should name the
        same).

        For encoders that write request JSON faster than `Request` models can (prq.spark).
        Each body must be a stored request (`prq.core.models.StoredRequest`, or the whole JSON of a
        `Request` with that id and endpoint), within max_body_bytes: the caller checks; a
        receiver answers anything else as a SerializationError. `locators=True` writes an id →
        endpoint locator per request (None: as `QueueSettings.request_locators` says, off by
        default), so lookups by id alone (`Queue.status`, `Queue.cancel`, the admin service)
        read it instead of asking the registered endpoints; it costs a key per request. At
        most MAX_BATCH_SIZE items; otherwise as `enqueue_many`.

        `fingerprints`: one per item (`prq.bulk.fingerprints` of its method and params), kept
        in its record. An id already known whose record carries another fingerprint is held
        by another request: it is not enqueued, and is among `conflict_ids` (and the
        duplicates) rather than a plain duplicate whose outcome is this request's. An id whose
        record has none (enqueued without, or by a caller) is a duplicate, as without them.

        `watch`: as for `enqueue_many` (stepped in this round trip, after its writes).
        """
        if not items:
            return BulkResult(data_loss=watch is not None and watch.lost)
        if len(items) > MAX_BATCH_SIZE:
            raise ValueError(f"at most {MAX_BATCH_SIZE} items per call")
        if fingerprints is not None and len(fingerprints) != len(items):
            raise ValueError(f"{len(fingerprints)} fingerprints for {len(items)} items")
        pickup = self._pickup_timeout(pickup_timeout_s)
        validate_endpoint(endpoint)
        lane = (endpoint, priority, producer, self._attempts(delivery))
        if locators is None:
            locators = self.settings.request_locators
        if attempt is not None and nonce is None:
            nonce = attempt.next_nonce()  # (one sending the batch again passes this one back)
        nonce = nonce or new_batch_nonce()
        return self._send(
            {lane: items}, pickup, nonce, locators, ledger, retry_failed,
            attempt.prefixes() if attempt is not None else ("", ""),
            {lane: fingerprints} if fingerprints is not None else None, watch,
        )  # fmt: skip

    def depth(self, endpoint: str) -> int:
        """Requests queued for `endpoint` now, over all priorities (one round trip when none
        is queued, two otherwise)."""
        keys = self.keys.endpoint(validate_endpoint(endpoint))
        levels = self._run(levels_from(keys, self._io.execute([levels_call(keys)])[0]))
        return sum(level.depth for level in levels)


def _chunks(items: Iterator[Request], size: int) -> Iterator[list[Request]]:
    while batch := list(islice(items, size)):
        yield batch
