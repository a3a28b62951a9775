"""The steps that queue requests: `enqueue` (one request, for a call; enqueue.lua) and
`enqueue_many` (a batch, for BulkClient; enqueue_many.lua), each a call builder and a reply
parser. How enqueue calls to one endpoint are merged into one script call is
prq.protocol.scripts.merging's."""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from prq.core.errors import QueueFull, SerializationError
from prq.core.keys import EndpointKeys
from prq.protocol.effects import Call, Reply, Resend
from prq.protocol.scripts.loading import ENQUEUE, ENQUEUE_MANY, STAMP
from prq.protocol.scripts.replies import RequestSnapshot, as_array, as_text, snapshot_of

__all__ = [
    "ENQUEUE_ARGS",
    "ENQUEUE_KEYS",
    "SHARED_HEAD_MIN",
    "BatchOutcome",
    "EnqueueOutcome",
    "enqueue_call",
    "enqueue_many_call",
    "parse_enqueue",
    "parse_enqueue_many",
    "parse_stamp",
    "stamp_call",
]


@dataclass(frozen=True, slots=True)
class EnqueueOutcome:
    """`counter` is set when the request was enqueued: its sequence number; `before` the last
    number the endpoint gave before (0: none; prq.node.data_loss judges both); `known` when its
    id already existed; `handed` when it went straight to a parked receiver (to be
    confirmed)."""

    counter: int | None
    known: RequestSnapshot | None
    handed: bool = False
    before: int = 0
    #: The sender's stamp on the endpoint after the enqueue (enqueue.lua; what it held, when
    #: it went back).
    stamp: int = 0
    #: What the stamp held when that was below the one the enqueue carried (0: gone): Redis
    #: lost or rolled back data since the sender's last step there (None: it was not).
    went_back: int | None = None
    #: Sent before and found the stamp low: it may be a replay of an enqueue that ran before
    #: the loss, whose record the loss took; nothing was written.
    refused: bool = False


def enqueue_call(
    keys: EndpointKeys,
    request_id: str,
    body: bytes,
    sender: str,
    now_ms: int,
    pickup_window_ms: int,
    request_ttl_ms: int,
    list_ttl_ms: int,
    in_flight_ttl_ms: int,
    receipt_ttl_ms: int,
    handoff_confirm_ms: int,
    receiver_timeout_ms: int,
    priority: int = 0,
    producer: str = "",
    max_attempts: int = 0,
    known_stamp: int = 0,
    stamp_generation: int = 0,
) -> Call:
    """`max_attempts` 0: at_most_once; else at_least_once, handed out at most that often.
    `now_ms` is the sender's clock (kept as when the request was created); the pickup deadline
    is `pickup_window_ms` after now by Redis's clock. `known_stamp`: the highest stamp `sender`
    was answered on the endpoint, of generation `stamp_generation` (stamp_call, or an earlier
    enqueue), 0 when it knows none it can rely on: a stamp below it says Redis lost
    data since. The call is sent as its
    twin that says so (prq.protocol.effects.Resend) on every attempt after its first: found
    the stamp low, that writes nothing, as it may be a replay of an enqueue the loss undid."""
    keys_of = (
        keys.request(request_id), keys.levels, keys.sequence, keys.parked, keys.parks,
        keys.take_receipt_prefix, keys.running, keys.limits, keys.level_prefix, keys.lease,
        keys.handoffs, keys.numbers, keys.sent_stamp(sender, stamp_generation),
    )  # fmt: skip
    args = (
        request_id, body, sender, now_ms, handoff_confirm_ms, request_ttl_ms, list_ttl_ms,
        keys.pulse_channel, keys.node_channel_prefix, in_flight_ttl_ms, receipt_ttl_ms,
        receiver_timeout_ms, priority, producer, max_attempts, pickup_window_ms, known_stamp,
    )  # fmt: skip
    first = ENQUEUE.call(keys_of, (*args, 0))
    return replace(first, resend=Resend(ENQUEUE.call(keys_of, (*args, 1))))


#: Values per request in an enqueue call; the keys shared by a merged call's requests.
ENQUEUE_ARGS: Final = 18
ENQUEUE_KEYS: Final = 13


def stamp_call(keys: EndpointKeys, node_id: str, generation: int, list_ttl_ms: int) -> Call:
    """Write `node_id`'s sender stamp on the endpoint afresh, of a new `generation` (stamp.lua),
    for a node that knows none there it can rely on, before it enqueues; the reply is the
    stamp (parse_stamp)."""
    return STAMP.call((keys.sent_stamp(node_id, generation),), (list_ttl_ms,))


def parse_stamp(reply: Reply) -> int:
    if not isinstance(reply, int) or reply <= 0:
        raise SerializationError(f"unexpected stamp reply from Redis: {reply!r:.200}")
    return reply


def parse_enqueue(reply: Reply, endpoint: str = "") -> EnqueueOutcome:
    """Raises QueueFull when the endpoint is at its max_pending (the stamp the reply carries
    is then not learned: that enqueue judged it and found it whole, so nothing is missed)."""
    items = as_array(reply, "enqueue")
    kind = as_text(items[0]) if items else ""
    if kind == "back" and len(items) == 2 and isinstance(items[1], int):
        return EnqueueOutcome(None, None, stamp=items[1], went_back=items[1], refused=True)
    stamp, low = items[-2:] if len(items) > 2 else (None, None)
    if not isinstance(stamp, int) or not isinstance(low, int):
        raise SerializationError(f"unexpected enqueue reply from Redis: {reply!r:.200}")
    went_back = None if low < 0 else low
    if (
        len(items) == 5
        and kind in ("new", "handed")
        and isinstance(items[1], int)
        and isinstance(items[2], int)
    ):
        return EnqueueOutcome(items[1], None, kind == "handed", items[2], stamp, went_back)
    if len(items) == 5 and kind == "full":
        raise QueueFull(
            f"endpoint {endpoint or '?'} holds {as_text(items[1])} queued requests, its "
            f"max_pending is {as_text(items[2])}: nothing was enqueued; try again later (or "
            "raise the limit)"
        )
    if kind == "known" and len(items) == 6:
        return EnqueueOutcome(None, snapshot_of(items[1:4]), stamp=stamp, went_back=went_back)
    raise SerializationError(f"unexpected enqueue reply from Redis: {reply!r:.200}")


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What one enqueue_many call did: requests accepted (queued by this batch) and the ids that
    were already known, so nothing was enqueued for them."""

    accepted: int
    duplicate_ids: list[str]
    counter: int
    #: New ids not written because the endpoint was at its max_pending (send them later).
    refused_ids: list[str] = field(default_factory=list)
    #: The endpoint's queued requests after the batch (over all priorities).
    depth: int = 0
    #: Ids the batch's ledger says a receiver took before, whose records are gone: not
    #: enqueued again (not among duplicate_ids).
    gone_ids: list[str] = field(default_factory=list)
    #: Ids the batch's task attempt wrote in another of its batches: not enqueued again (not
    #: among duplicate_ids).
    repeated_ids: list[str] = field(default_factory=list)
    #: Known ids whose record carries another fingerprint than the new request's: another
    #: request holds the id; not enqueued again (not among duplicate_ids).
    conflict_ids: list[str] = field(default_factory=list)


def enqueue_many_call(
    keys: EndpointKeys,
    nonce: str,
    items: Sequence[tuple[str, str | bytes]],
    now_ms: int,
    pickup_window_ms: int,
    request_ttl_ms: int,
    list_ttl_ms: int,
    priority: int = 0,
    producer: str = "",
    max_attempts: int = 0,
    one_way: bool = False,
    ledger: tuple[str, int] | None = None,
    retry_failed: bool = False,
    attempt_of: tuple[str, str] = ("", ""),
    fingerprints: Sequence[bytes] | None = None,
) -> Call:
    """All `items` are queued at `priority` for `producer`, at_least_once when `max_attempts`
    is above 0 (their bodies should say the same); `one_way`: no answer is kept (notify).
    `ledger`: (token, TTL in ms) of the batch's dedup ledger (prq.core.keys.ledger_token): ids a
    receiver took before are not queued again while it lives, though their records are gone.
    `retry_failed`: ids whose record says they ended without an answer for a reason worth
    another try (data loss, a lost or shut-down receiver, attempts used up) are queued afresh.
    `attempt_of`: the prefixes of the nonces of this batch's task attempt and of its task
    (prq.bulk.TaskAttempt; empty: none), which `nonce` begins with.
    `fingerprints`: one per item (prq.bulk.fingerprints), stored in its record as its first
    named field 'fp': a known id whose record has another one is a conflict, not a duplicate.
    `now_ms` is the enqueuer's clock (the creation time); the pickup deadline is
    `pickup_window_ms` after now by Redis's clock.

    The records are spelled here, in the queued form (_body.lua): a batch of SHARED_HEAD_MIN
    or more goes whole (shape Q2: Redis stores each string as it comes, the cheapest write
    there is; the call draws its shared head's token, kept when the call is sent again), a
    smaller one as each record's fields and body (shape Q1: the script adds the deadline and
    sequence number inline, saving the batch a shared head)."""
    shape = "Q2" if len(items) >= SHARED_HEAD_MIN else "Q1"
    token = secrets.token_urlsafe(8) if shape == "Q2" else ""
    if shape == "Q2":
        named = [_queued_field(b"bh", token.encode())]
    else:
        named = [_queued_field(b"bn", nonce.encode())]
    if priority:
        named.append(_queued_field(b"pri", b"%d" % priority))
    if max_attempts > 0:
        named += [
            _queued_field(b"ma", b"%d" % max_attempts),
            _queued_field(b"pw", b"%d" % pickup_window_ms),
            _queued_field(b"pro", producer.encode()),
        ]
    if one_way:
        named.append(_queued_field(b"ow", b"1"))
    if ledger is not None:
        named.append(_queued_field(b"dd", ledger[0].encode()))
    named.append(b"b:")
    fields = b"".join(named)
    args: list[str | int | bytes] = [
        nonce, now_ms, pickup_window_ms, request_ttl_ms, list_ttl_ms, keys.pulse_channel,
        priority, producer, shape, token, ledger[1] if ledger is not None else 0,
        1 if retry_failed else 0, *attempt_of,
    ]  # fmt: skip
    if fingerprints is not None and len(fingerprints) != len(items):
        raise ValueError("one fingerprint per item")
    if shape == "Q2":
        args += _whole_records(keys.request_prefix, b"Q2%d," % now_ms, fields, items, fingerprints)
    else:
        for at, (request_id, body) in enumerate(items):
            raw = body.encode() if isinstance(body, str) else body
            mark = b"" if fingerprints is None else _queued_field(b"fp", fingerprints[at])
            args += [request_id, mark + fields + raw]
    endpoint_keys: tuple[str, ...] = (
        keys.levels, keys.sequence, keys.request_prefix, keys.limits, keys.level_prefix,
        keys.numbers,
    )  # fmt: skip
    if ledger is not None:
        endpoint_keys += (keys.ledger(ledger[0]),)
    return ENQUEUE_MANY.call(endpoint_keys, tuple(args))


def _whole_records(
    prefix: str,
    head: bytes,
    fields: bytes,
    items: Sequence[tuple[str, str | bytes]],
    fingerprints: Sequence[bytes] | None,
) -> list[str | int | bytes]:
    """The Q2 shape's arguments: each record's key and its whole string (its head, its place,
    its fingerprint first when it has one, the batch's fields, its body)."""
    args: list[str | int | bytes] = []
    if fingerprints is None:
        for place, (request_id, body) in enumerate(items, 1):
            raw = body.encode() if isinstance(body, str) else body
            args += [prefix + request_id, b"%b%d,%b%b" % (head, place, fields, raw)]
        return args
    for place, ((request_id, body), fp) in enumerate(zip(items, fingerprints, strict=True), 1):
        raw = body.encode() if isinstance(body, str) else body
        args += [prefix + request_id, b"%b%d,fp%d:%b%b%b" % (head, place, len(fp), fp, fields, raw)]
    return args


#: The smallest batch enqueue_many sends whole, with a shared head (see enqueue_many_call).
SHARED_HEAD_MIN = 8


def _queued_field(name: bytes, value: bytes) -> bytes:
    """One named field of the queued form (_body.lua: its name, its length, ':', its value)."""
    return b"%b%d:%b" % (name, len(value), value)


def parse_enqueue_many(reply: Reply, expected: int) -> BatchOutcome:
    items = as_array(reply, "enqueue_many")
    head = items[:_COUNTS]
    if len(head) < _COUNTS or not all(isinstance(v, int) for v in head):
        raise SerializationError(f"unexpected enqueue_many reply from Redis: {reply!r:.200}")
    counts: list[int] = [v for v in head if isinstance(v, int)]
    accepted, duplicates, counter, refused, depth, gone, repeats, conflicts = counts
    listed = duplicates + refused + gone + repeats + conflicts
    if len(items) != _COUNTS + listed or accepted + listed != expected:
        raise SerializationError(f"unexpected enqueue_many reply from Redis: {reply!r:.200}")
    ids = [as_text(v) for v in items[_COUNTS:]]
    cuts = list(itertools.accumulate((duplicates, refused, gone, repeats, conflicts), initial=0))
    dup_ids, refused_ids, gone_ids, repeated_ids, conflict_ids = (
        ids[a:b] for a, b in itertools.pairwise(cuts)
    )
    return BatchOutcome(
        accepted, dup_ids, counter, refused_ids, depth, gone_ids, repeated_ids, conflict_ids
    )


#: The counts that open an enqueue_many reply (enqueue_many.lua), before the ids.
_COUNTS: Final = 8
