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

import re
import secrets
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice
from operator import itemgetter
from typing import TYPE_CHECKING, Self

from pydantic import JsonValue, TypeAdapter
from pydantic_core import to_json

from prq.core import bodies
from prq.core.config import QueueSettings, RedisSettings
from prq.core.errors import ConfigurationError, PrqError, QueueFull, SerializationError
from prq.core.keys import EndpointKeys, KeySchema, ledger_token
from prq.core.models import (
    DELIVERY_MODES,
    REQUEST_ID_PATTERN,
    Delivery,
    Request,
    Response,
    check_body_size,
    decode_stored_request,
    encode_stored_request,
    validate_endpoint,
)
from prq.observe import tracing
from prq.protocol.effects import Call, Exec
from prq.protocol.flows.layout import old_layout_message
from prq.protocol.flows.registry import registry_calls
from prq.protocol.levels import levels_call, levels_from
from prq.protocol.outcomes import open_response, resolve, response_of
from prq.protocol.scripts.enqueue import enqueue_many_call, parse_enqueue_many
from prq.protocol.scripts.liveness import canary_call, parse_canary
from prq.protocol.scripts.redelivery import Redelivery
from prq.protocol.scripts.replies import RequestSnapshot
from prq.protocol.scripts.request_state import (
    MAX_READ_IDS,
    parse_snapshots,
    parse_withdraw,
    read_response_call,
    withdraw_call,
)
from prq.protocol.signing import Signer
from prq.protocol.stream_keeper import StreamKeeper
from prq.transport.sync_io import SyncRedisIO
from prq.transport.topology import is_cluster_url

if TYPE_CHECKING:
    from prq.datastreams import DataStreamStore

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_LEDGER_TTL_S",
    "BatchRefused",
    "BulkClient",
    "BulkResult",
    "Ledger",
    "LossWatch",
    "Rejected",
    "TaskAttempt",
]

#: Requests per round trip (the measured sweet spot: larger batches gain little).
DEFAULT_BATCH_SIZE = 1000
#: Most requests in one script call (Lua's unpack limit is far above; keeps Redis responsive).
MAX_BATCH_SIZE = 5000
#: The producer named in detached requests that do not name one.
BULK_PRODUCER = "bulk"
#: Where a batch's requests queue: (endpoint, priority, producer, max attempts: 0 for
#: at_most_once); one script call each.
Lane = tuple[str, int, str, int]
#: Encoded requests by lane, and the requests refused before any write: one round trip's worth.
Encoded = tuple[dict[Lane, list[tuple[str, str | bytes]]], list["Rejected"]]
#: What the requests of a batch with the same endpoint, method, service, priority, producer and
#: delivery share: their JSON around the params, the id and the headers, and their lane's list.
Shape = tuple[bytes, bytes, list[tuple[str, str | bytes]]]
#: An id that needs no JSON escaping, as a validated Request's (fullmatch: no trailing newline
#: slips through `$`); and ids of only such characters, checked a batch at a time.
_PLAIN_ID = re.compile(REQUEST_ID_PATTERN).fullmatch
_PLAIN_ID_CHARS = re.compile(r"[A-Za-z0-9_.:\-]*").fullmatch
#: The fields that make a request's shape (see BulkClient._shape), read from its __dict__.
_shape_key = itemgetter(
    "endpoint", "method", "service", "priority", "producer", "delivery", "response_ttl_s"
)
#: Request.params' JSON, by the serializer of its type (NaN and infinities as null, as the
#: models write them; pydantic_core.to_json alone would write NaN).
_params_json = TypeAdapter(JsonValue).serializer.to_json


def new_batch_nonce() -> str:
    """A fresh batch nonce (stored in every record the batch writes, as field `bn`): 11
    URL-safe characters, 64 random bits.

    A nonce only has to differ from those of the other batches that send the same id while its
    record lives; two such batches drawing the same one (a chance of 2**-64 per pair) would
    only count the second's copy as accepted instead of duplicate (nothing is enqueued twice:
    the record exists). A uuid4's 32 hex characters cost 21 more bytes per queued request.
    """
    return secrets.token_urlsafe(8)


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


#: How long a loss watch outlives its last read.
LOSS_WATCH_TTL_S = 3600.0


@dataclass(slots=True)
class LossWatch:
    """Tells a reader of outcomes whether Redis lost data while it waited, so that a request
    whose record is missing is known lost (DataLoss) rather than expired.

    A counter beside the endpoint's records (prq:{e}:lw:<token>), stepped by the same script
    as a node's data-loss canary (scripts/canary.lua) with every read of outcomes
    (`BulkClient.outcomes(..., watch=)`), after the records: a value that is not the last one
    plus one means the key was lost or went back (a restart without persistence, a flush, a
    failover to a replica that missed writes). A read sent again (a lost reply, a script cache
    reloaded) finds the step already taken, so a replay never hides a loss nor invents one.
    Start it (`BulkClient.start_watch`) before sending what it watches; it lives an hour past
    its last read.
    """

    token: str = field(default_factory=lambda: secrets.token_urlsafe(8))
    #: The counter's value at the last read (None: not started).
    count: int | None = None
    #: Redis lost data since the watch started (stays True).
    lost: bool = False

    def saw(self, value: int) -> None:
        """Take the counter's value a read returned."""
        if self.count is not None and value != self.count + 1:
            self.lost = True
        if not self.lost:
            self.count = value


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
    #: Requests refused before any write (an invalid endpoint, a body over max_body_bytes).
    rejected: list[Rejected] = field(default_factory=list)
    #: Each endpoint written to: its queued requests (over all priorities) after this call's
    #: last batch for it, as Redis counted them then (to hold back by: backpressure).
    depths: dict[str, int] = field(default_factory=dict)

    @property
    def duplicates(self) -> int:
        return len(self.duplicate_ids)

    def add(self, other: BulkResult) -> None:
        self.accepted += other.accepted
        self.duplicate_ids += other.duplicate_ids
        self.expired_ids += other.expired_ids
        self.repeated_ids += other.repeated_ids
        self.rejected += other.rejected
        self.depths |= other.depths


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


class BulkClient:
    """Enqueues detached requests in batches and reads their outcomes (blocking)."""

    def __init__(
        self,
        redis_settings: RedisSettings,
        *,
        prefix: str = "prq",
        settings: QueueSettings | None = None,
        datastreams: DataStreamStore | None = None,
    ) -> None:
        self.settings = settings or QueueSettings()
        self.redis_settings = redis_settings
        self.keys = KeySchema(prefix, sharded=is_cluster_url(redis_settings.url))
        self._io = SyncRedisIO(redis_settings, self.settings)
        #: Endpoints checked for the previous layout's lanes (flows.layout.layout_flow), once each.
        self._layout_checked: set[str] = set()
        #: Signs the requests and checks the responses (None: no signing key; prq.protocol.signing).
        self.signer = Signer.from_settings(self.settings)
        #: Keeps bodies over inline_limit_bytes beside Redis, and reads them back (prq.core.bodies).
        self.streams = StreamKeeper(datastreams, self.settings)

    @classmethod
    def from_url(
        cls,
        url: str | None = None,
        *,
        prefix: str = "prq",
        settings: QueueSettings | None = None,
        datastreams: DataStreamStore | None = None,
        redis_settings: RedisSettings | None = None,
    ) -> Self:
        """A client for `url` (else `PRQ_REDIS_URL`, or `redis_settings.url`), with the
        connection settings of `redis_settings` (a `url` given beside them replaces theirs)."""
        redis = RedisSettings.from_url(url) if redis_settings is None else redis_settings
        return cls(redis.with_url(url), prefix=prefix, settings=settings, datastreams=datastreams)

    def close(self) -> None:
        self._io.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- enqueue ------------------------------------------------------------------------------

    def enqueue_many(
        self,
        requests: Iterable[Request],
        *,
        pickup_timeout_s: float | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        nonce: str | None = None,
        ledger: Ledger | None = None,
        retry_failed: bool = False,
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

        Raises QueueUnavailable (Redis away past the retry budget), QueueFull (Redis out of
        memory) or ConfigurationError; what was sent before stays enqueued, and sending the
        same requests again enqueues only what is missing.

        Called in a traced span (prq.observe.tracing), the call is one PRODUCER span, whose context
        every request carries in its headers (unless it names its own traceparent).
        """
        trace, traced = tracing.sending_batch()
        with traced:
            result = self._enqueue_many(
                requests, pickup_timeout_s, batch_size, nonce, ledger, retry_failed, trace
            )
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
    ) -> BulkResult:
        if not 1 <= batch_size <= MAX_BATCH_SIZE:
            raise ValueError(f"batch_size must be within 1..{MAX_BATCH_SIZE}")
        pickup = self.settings.pickup_timeout_s if pickup_timeout_s is None else pickup_timeout_s
        locators = self.settings.request_locators
        total = BulkResult()

        def sent(encoded: Encoded) -> BulkResult:  # one round trip, with a fresh nonce if unset
            return self._sent(
                encoded, pickup, nonce or new_batch_nonce(), locators, ledger, retry_failed
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
        """
        if not items:
            return BulkResult()
        if len(items) > MAX_BATCH_SIZE:
            raise ValueError(f"at most {MAX_BATCH_SIZE} items per call")
        pickup = self.settings.pickup_timeout_s if pickup_timeout_s is None else pickup_timeout_s
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
        )  # fmt: skip

    def _attempts(self, delivery: Delivery) -> int:
        """The attempts a request of `delivery` gets (0: at_most_once, never handed out again)."""
        return self.settings.max_attempts if delivery == "at_least_once" else 0

    def _encode_batch(
        self,
        batch: Sequence[Request],
        trace: dict[str, str] | None = None,
        *,
        check_ids: bool = False,
    ) -> Encoded:
        """The batch's stored bodies by lane, and the requests refused before any write.

        Each body is the bytes of `encode_stored_request` of the request with its producer
        filled in, built from JSON pieces shared by the requests of a shape (see `_shape`) and
        one serializer call for its params (and one for its headers when it has any): no model
        copy, no validation again. A request the pieces do not spell (a Request subclass, one
        with streams, one whose id needs escaping: built without validation) goes through
        `_encode`. Ids are checked all at once; when one fails, the batch is encoded again
        with each id checked. `trace`: the trace context each request carries (with_trace).
        """
        rejected: list[Rejected] = []
        by_lane: dict[Lane, list[tuple[str, str | bytes]]] = {}
        shapes: dict[tuple[object, ...], Shape | None] = {}
        limit = self.settings.max_body_bytes
        join = b"".join
        ids: list[str] = []
        for request in batch:
            if type(request) is Request:
                fields = request.__dict__  # what the attributes read, without their lookup
                rid = fields["id"]
                if not fields["streams"] and (not check_ids or _PLAIN_ID(rid)):
                    key = _shape_key(fields)
                    try:
                        shape = shapes[key]
                    except KeyError:
                        shape = shapes[key] = self._shape(request, by_lane)
                    if shape is not None:
                        head, tail, items = shape
                        params, headers = fields["params"], fields["headers"]
                        if trace:
                            headers = tracing.with_trace(headers, trace)
                        body = join((
                            head, b"" if params is None else b',"p":' + _params_json(params),
                            tail, b',"h":' + to_json(headers) if headers else b"", b"}",
                        ))  # fmt: skip
                        if len(body) <= limit:
                            items.append((rid, body))
                            ids.append(rid)
                            continue
            try:
                encoded = self._encode(request, trace)
            except PrqError as exc:
                rejected.append(Rejected(request.id, exc))
                continue
            attempts = self._attempts(request.delivery)
            lane = (request.endpoint, request.priority, request.producer or BULK_PRODUCER, attempts)
            by_lane.setdefault(lane, []).append(encoded)
        if not check_ids and not _PLAIN_ID_CHARS("".join(ids)):
            return self._encode_batch(batch, trace, check_ids=True)
        return {lane: items for lane, items in by_lane.items() if items}, rejected

    def _shape(
        self, request: Request, by_lane: dict[Lane, list[tuple[str, str | bytes]]]
    ) -> Shape | None:
        """The JSON pieces and the lane's list of the requests with the endpoint, method,
        service, priority, producer, delivery and asked response TTL of `request`, or None
        when they are not what a validated Request holds. The stored form's fields, in its
        JSON's order (models.StoredRequest): m (method), p (params, left out when None), then s
        (service), q (priority), r (producer), d (delivery), k (response TTL), each left out at
        its default, and h (headers, left out when empty); the pieces are what comes before the
        params and what comes between them and the headers."""
        endpoint, method, service = request.endpoint, request.method, request.service
        priority, producer, delivery = request.priority, request.producer, request.delivery
        keep = request.response_ttl_s
        if not (
            type(endpoint) is str and type(method) is str and type(service) is str
            and type(priority) is int and (producer is None or type(producer) is str)
            and delivery in DELIVERY_MODES and (keep is None or type(keep) is float)
        ):  # fmt: skip
            return None
        try:
            validate_endpoint(endpoint)
        except PrqError:
            return None  # _encode raises it, for each request
        lane = (endpoint, priority, producer or BULK_PRODUCER, self._attempts(delivery))
        head = b'{"m":%b' % to_json(method)
        tail = b"".join((
            b',"s":%b' % to_json(service) if service else b"",
            b',"q":%d' % priority if priority else b"",
            b',"r":%b' % to_json(BULK_PRODUCER if producer is None else producer),
            b',"d":%b' % to_json(delivery) if delivery != "at_most_once" else b"",
            b',"k":%b' % to_json(keep) if keep is not None else b"",
        ))  # fmt: skip
        return head, tail, by_lane.setdefault(lane, [])

    def _sent(
        self,
        encoded: Encoded,
        pickup_timeout_s: float,
        nonce: str,
        locators: bool,
        ledger: Ledger | None,
        retry_failed: bool,
    ) -> BulkResult:
        """One batch's round trip, with its refused requests added to the result."""
        by_lane, rejected = encoded
        result = self._send(by_lane, pickup_timeout_s, nonce, locators, ledger, retry_failed)
        result.rejected += rejected
        return result

    def _send(
        self,
        by_lane: Mapping[Lane, Sequence[tuple[str, str | bytes]]],
        pickup_timeout_s: float,
        nonce: str,
        locators: bool,
        ledger: Ledger | None = None,
        retry_failed: bool = False,
        attempt_of: tuple[str, str] = ("", ""),
    ) -> BulkResult:
        """One round trip: a script call per endpoint, priority and producer (plus the
        locators); counts from the replies."""
        result = BulkResult()
        if not by_lane:
            return result
        self._check_layouts([lane[0] for lane in by_lane])
        settings = self.settings
        now_ms = int(time.time() * 1000)
        request_ttl_s = settings.request_ttl_s(pickup_timeout_s)
        locator_ttl_ms = int(settings.locator_ttl_s(pickup_timeout_s) * 1000)
        calls: list[Call] = []
        for (endpoint, priority, producer, attempts), items in by_lane.items():
            items = self._spilled(endpoint, items, pickup_timeout_s)
            if self.signer is not None:
                valid_ms = int(settings.signature_ttl_s(pickup_timeout_s, max(1, attempts)) * 1000)
                items = self._signed(endpoint, items, now_ms + valid_ms)
            calls.append(
                enqueue_many_call(
                    self.keys.endpoint(endpoint),
                    nonce,
                    items,
                    now_ms,
                    int(pickup_timeout_s * 1000),
                    int(request_ttl_s * 1000),
                    int(settings.list_ttl_s * 1000),
                    priority,
                    producer,
                    attempts,
                    ledger=ledger.spelled() if ledger is not None else None,
                    retry_failed=retry_failed,
                    attempt_of=attempt_of,
                )
            )
            if locators:
                calls += [
                    Call(("SET", self.keys.locator(request_id), endpoint, "PX", locator_ttl_ms))
                    for request_id, _ in items
                ]
        # listed where the admin view and lookups by id look (as nodes do, prq.protocol.presence)
        endpoints = list(dict.fromkeys(lane[0] for lane in by_lane))
        calls += registry_calls(self.keys, settings, endpoints, now_ms)
        replies = self._io.execute(calls)  # one round trip; replay-safe (batch nonces)
        at = 0
        refused: dict[str, int] = {}
        for (endpoint, *_), items in by_lane.items():
            outcome = parse_enqueue_many(replies[at], len(items))
            result.accepted += outcome.accepted
            result.duplicate_ids += outcome.duplicate_ids + outcome.gone_ids
            result.duplicate_ids += outcome.repeated_ids
            result.expired_ids += outcome.gone_ids
            result.repeated_ids += outcome.repeated_ids
            result.depths[endpoint] = outcome.depth
            if outcome.refused_ids:
                refused[endpoint] = refused.get(endpoint, 0) + len(outcome.refused_ids)
            at += 1 + (len(items) if locators else 0)
        if refused:
            raise BatchRefused(result, refused)
        return result

    def _check_layouts(self, endpoints: Sequence[str]) -> None:
        """Refuse endpoints that still hold the previous layout's lanes, before anything is
        written (ConfigurationError; one EXISTS each, the first time an endpoint is used)."""
        new = [e for e in dict.fromkeys(endpoints) if e not in self._layout_checked]
        if not new:
            return
        olds = [self.keys.endpoint(e).old_levels for e in new]
        found = self._io.execute([Call(("EXISTS", old)) for old in olds])
        for endpoint, old, exists in zip(new, olds, found, strict=True):
            if exists:
                raise ConfigurationError(
                    old_layout_message(endpoint, old, self.keys.endpoint(endpoint).tag)
                )
            self._layout_checked.add(endpoint)

    def _spilled(
        self, endpoint: str, items: Sequence[tuple[str, str | bytes]], pickup_timeout_s: float
    ) -> Sequence[tuple[str, str | bytes]]:
        """`items` for `endpoint`, with the bodies over inline_limit_bytes written to the
        DataStreamStore and a marker in their place (none without a store; prq.core.bodies). A body
        that is not a stored request goes as it is (its receiver dead-letters it)."""
        if self.streams.store is None:
            return items
        spilled: list[tuple[str, str | bytes]] = []
        for request_id, body in items:
            data = body.encode() if isinstance(body, str) else body
            if self.streams.spills(data):
                try:
                    request = decode_stored_request(data, endpoint, request_id)
                except SerializationError:
                    pass
                else:
                    data = self.streams.spill_request(request, data, pickup_timeout_s)
            spilled.append((request_id, data))
        return spilled

    def _signed(
        self, endpoint: str, items: Sequence[tuple[str, str | bytes]], expiry_ms: int
    ) -> list[tuple[str, str | bytes]]:
        signer = self.signer
        assert signer is not None
        return [
            (rid, signer.sign("request", rid, endpoint,
                              body.encode() if isinstance(body, str) else body, expiry_ms))
            for rid, body in items
        ]  # fmt: skip

    def _encode(
        self, request: Request, trace: dict[str, str] | None = None
    ) -> tuple[str, str | bytes]:
        validate_endpoint(request.endpoint)
        if any(not stream.stored for stream in request.streams.values()):
            raise SerializationError(
                f"request {request.id} carries DataStreams: the bulk client does not store "
                "them; send it through a queue given a DataStreamStore"
            )
        if request.producer is None:
            request = request.model_copy(update={"producer": BULK_PRODUCER})
        if trace:
            headers = tracing.with_trace(request.headers, trace)
            if headers is not request.headers:
                request = request.model_copy(update={"headers": headers})
        body = encode_stored_request(request)
        check_body_size(body, self.settings.max_body_bytes, "request", request.id)
        return request.id, body

    def depth(self, endpoint: str) -> int:
        """Requests queued for `endpoint` now, over all priorities (one round trip when none
        is queued, two otherwise)."""
        keys = self.keys.endpoint(validate_endpoint(endpoint))
        flow = levels_from(keys, self._io.execute([levels_call(keys)])[0])
        replies: object = None
        try:
            while True:  # levels_from asks for one more read at most
                effect = flow.send(replies)
                assert isinstance(effect, Exec)
                replies = self._io.execute(effect.calls)
        except StopIteration as done:
            return sum(level.depth for level in done.value)

    # -- outcomes -----------------------------------------------------------------------------

    def start_watch(self, endpoint: str, watch: LossWatch) -> None:
        """Start `watch` on `endpoint` (one round trip), before sending what it watches."""
        keys = self.keys.endpoint(validate_endpoint(endpoint))
        watch.saw(parse_canary(self._io.execute([self._watch_call(keys, watch)])[0]))

    @staticmethod
    def _watch_call(keys: EndpointKeys, watch: LossWatch) -> Call:
        ttl_ms = int(LOSS_WATCH_TTL_S * 1000)
        return canary_call(keys.loss_watch(watch.token), ttl_ms, watch.count)

    def outcomes(
        self, endpoint: str, request_ids: Sequence[str], *, watch: LossWatch | None = None
    ) -> dict[str, RequestSnapshot]:
        """Where each request stands, with its stored response once it has one, in one round
        trip (two when some must be withdrawn). A request whose receiver stopped beating for
        the receiver timeout is declared lost here (state "cancelled", reason
        "receiver_lost"), and one still queued past its pickup deadline is withdrawn (state
        "withdrawn", reason "pickup_timeout"; its id may be enqueued again), as a waiting
        caller would do. With a started `watch`, the same round trip reads it after the
        records: `watch.lost` then says whether a record found missing may have been lost."""
        keys = self.keys.endpoint(validate_endpoint(endpoint))
        if not request_ids:
            return {}
        timeout_ms = int(self.settings.receiver_timeout_s * 1000)
        redelivery = Redelivery.of(self.settings)
        parts = [
            request_ids[start : start + MAX_READ_IDS]
            for start in range(0, len(request_ids), MAX_READ_IDS)
        ]
        calls = [read_response_call(keys, part, timeout_ms, redelivery) for part in parts]
        if watch is not None:
            calls.append(self._watch_call(keys, watch))
        replies = self._io.execute(calls)
        if watch is not None:
            watch.saw(parse_canary(replies[len(parts)]))
        found: dict[str, RequestSnapshot] = {}
        for part, reply in zip(parts, replies[: len(parts)], strict=True):
            found.update(zip(part, parse_snapshots(reply, len(part)), strict=True))
        now_ms = int(time.time() * 1000)
        overdue = [
            request_id
            for request_id, snapshot in found.items()
            if snapshot.state == "queued"
            and snapshot.pickup_left_ms is not None
            and snapshot.pickup_left_ms < 0
        ]
        if overdue:
            tombstone_ms = int(self.settings.cancel_marker_ttl_s * 1000)
            why = "pickup_timeout"
            withdraws = [
                withdraw_call(keys, rid, why, tombstone_ms, now_ms, uuid.uuid4().hex)
                for rid in overdue
            ]
            for request_id, reply in zip(overdue, self._io.execute(withdraws), strict=True):
                found[request_id] = parse_withdraw(reply)[0]
        return found

    def resolve(self, snapshot: RequestSnapshot, request_id: str, endpoint: str) -> Response | None:
        """What a final state means to a caller (prq.protocol.outcomes.resolve), with a response
        kept beside Redis read back from the store (blocking)."""
        if snapshot.state != "done":
            return resolve(snapshot, request_id, endpoint, self.signer)
        data = open_response(self.signer, request_id, endpoint, snapshot.response)
        if bodies.is_spilled(data):
            try:
                data = self.streams.load_body(data, f"the response to {request_id}")
            except PrqError as exc:
                exc.maybe_executed = True
                raise
        return response_of(data, request_id)


def _chunks(items: Iterator[Request], size: int) -> Iterator[list[Request]]:
    while batch := list(islice(items, size)):
        yield batch
