"""The Lua steps: one file per operation, each with a typed call builder and reply parser.

Operations are data. A builder returns a `Call` (the command to send, KEYS and ARGV included);
a parser turns the raw reply into typed values. The async and the blocking queue send the same
calls, so the protocol is written once. Scripts are sent with EVALSHA; the I/O layer loads them
(SCRIPT LOAD) when Redis answers NOSCRIPT, e.g. after a restart.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from importlib import resources
from typing import Final

from prq.core.config import QueueSettings
from prq.core.errors import QueueFull, SerializationError
from prq.core.keys import EndpointKeys
from prq.protocol.effects import Call, Reply

__all__ = [
    "ALL_SCRIPTS",
    "DEAD_LETTER",
    "HANDED",
    "MAX_READ_IDS",
    "PURGE_DEAD",
    "REPLAY_DEAD",
    "BatchOutcome",
    "EnqueueOutcome",
    "Redelivery",
    "RequestSnapshot",
    "Script",
    "TakeReply",
    "TakenItem",
    "apply_response_call",
    "beat_call",
    "canary_call",
    "cancel_call",
    "enqueue_call",
    "enqueue_many_call",
    "for_cluster",
    "hand_back_call",
    "merge_answers",
    "merge_calls",
    "merge_enqueues",
    "parse_apply_response",
    "parse_beat",
    "parse_canary",
    "parse_enqueue",
    "parse_enqueue_many",
    "parse_snapshot",
    "parse_snapshots",
    "parse_take",
    "parse_unpark",
    "parse_withdraw",
    "presence_call",
    "read_response_call",
    "script_load_calls",
    "take_call",
    "unpark_call",
    "withdraw_call",
]


_INCLUDE: Final = re.compile(r"^-- include: (_[a-z_]+)$", re.MULTILINE)
#: A helper file's function: from `local function <name>(` at the start of a line to the first
#: line that is `end` alone (the helpers indent their bodies; tests/unit checks the convention).
_HELPER: Final = re.compile(r"^local function (\w+)\(.*?^end\n", re.MULTILINE | re.DOTALL)
#: Lua comments: a block, or the rest of a line (no string of prq's scripts holds "--").
_COMMENT: Final = re.compile(r"--\[\[.*?\]\]|--[^\n]*", re.DOTALL)
_WORD: Final = re.compile(r"\w+")


def _unused(source: str, helpers: dict[str, str]) -> list[str]:
    """The helper functions (name -> text) of `source` that nothing else in it names (comments
    aside), directly or through another helper it keeps."""
    rest = source
    for chunk in helpers.values():
        rest = rest.replace(chunk, "", 1)
    calls = {
        helper: set(_WORD.findall(_COMMENT.sub("", chunk))) & helpers.keys()
        for helper, chunk in helpers.items()
    }
    kept: set[str] = set()
    todo = set(_WORD.findall(_COMMENT.sub("", rest))) & helpers.keys()
    while todo:
        helper = todo.pop()
        kept.add(helper)
        todo |= calls[helper] - kept
    return [chunk for helper, chunk in helpers.items() if helper not in kept]


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua script, identified by the SHA1 of its source."""

    name: str
    source: str
    sha: str

    @classmethod
    def load(cls, name: str) -> Script:
        """Read `<name>.lua`; a line `-- include: _lib` is replaced by the text of `_lib.lua`
        (shared helpers, written once), so what Redis runs is one self-contained script. The
        helpers' functions that the script does not call, directly or through another kept
        helper, are left out: Redis builds each `local function` (a closure) on every call."""
        files = resources.files(__package__)
        source = files.joinpath(f"{name}.lua").read_text("utf-8")
        helpers: dict[str, str] = {}

        def include(m: re.Match[str]) -> str:
            text = files.joinpath(f"{m.group(1)}.lua").read_text("utf-8")
            helpers.update((f.group(1), f.group(0)) for f in _HELPER.finditer(text))
            return text

        source = _INCLUDE.sub(include, source)
        for chunk in _unused(source, helpers):
            source = source.replace(chunk, "", 1)
        return cls(name, source, hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest())

    def call(self, keys: tuple[str, ...], args: tuple[str | int | bytes, ...]) -> Call:
        return Call(("EVALSHA", self.sha, len(keys), *keys, *args), self)


ENQUEUE: Final = Script.load("enqueue")
TAKE: Final = Script.load("take")
APPLY_RESPONSE: Final = Script.load("apply_response")
WITHDRAW: Final = Script.load("withdraw")
READ_RESPONSE: Final = Script.load("read_response")
BEAT: Final = Script.load("beat")
CANCEL: Final = Script.load("cancel")
CANARY: Final = Script.load("canary")
PRESENCE: Final = Script.load("presence")
ENQUEUE_MANY: Final = Script.load("enqueue_many")
DEAD_LETTER: Final = Script.load("dead_letter")
REPLAY_DEAD: Final = Script.load("replay_dead")
PURGE_DEAD: Final = Script.load("purge_dead")
HAND_BACK: Final = Script.load("hand_back")
UNPARK: Final = Script.load("unpark")
ALL_SCRIPTS: Final = (
    ENQUEUE, TAKE, APPLY_RESPONSE, WITHDRAW, READ_RESPONSE, BEAT, CANCEL, CANARY, PRESENCE,
    ENQUEUE_MANY, DEAD_LETTER, REPLAY_DEAD, PURGE_DEAD, HAND_BACK, UNPARK,
)  # fmt: skip


def script_load_calls() -> tuple[Call, ...]:
    """SCRIPT LOAD for every script, for one round trip."""
    return tuple(Call(("SCRIPT", "LOAD", script.source), script) for script in ALL_SCRIPTS)


def _sharded(script: Script) -> Script:
    source = script.source.replace("redis.call('PUBLISH', ", "redis.call('SPUBLISH', ")
    sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()
    return Script(script.name, source, sha)


#: On a Redis Cluster each script publishes with SPUBLISH: every channel it publishes to is a
#: shard channel of its own slot (the endpoint's pulse channel, and its node channels,
#: EndpointKeys.node_channel_prefix), heard by that shard's subscribers only.
SHARDED: Final = {script.sha: _sharded(script) for script in ALL_SCRIPTS}


def for_cluster(call: Call) -> Call:
    """`call` as a cluster runs it: a script call names the script's SPUBLISH twin."""
    twin = SHARDED.get(call.script.sha) if call.script is not None else None
    if twin is None:
        return call
    if call.args[0] == "EVALSHA":
        return Call(("EVALSHA", twin.sha, *call.args[2:]), twin)
    return Call(("SCRIPT", "LOAD", twin.source), twin)


def _text(value: Reply) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return str(value)


def _array(reply: Reply, what: str) -> list[Reply]:
    if not isinstance(reply, list):
        raise SerializationError(f"unexpected {what} reply from Redis: {reply!r:.200}")
    return reply


# -- enqueue ------------------------------------------------------------------------------------

#: The state of a request handed to a parked receiver that has not confirmed it yet
#: (_handoff.lua): not picked up. Scripts that report a state to users read it as "queued".
HANDED: Final = "handed"


@dataclass(frozen=True, slots=True)
class RequestSnapshot:
    """A request's state as a script saw it; `response` is raw JSON bytes or empty."""

    state: str
    response: bytes
    reason: str
    #: How long until a queued request stops being handed out, ms by Redis's clock (negative
    #: once past; read_response only; None when unknown).
    pickup_left_ms: int | None = None
    #: read_response handed this at_least_once request out again, or dead-lettered it.
    redelivered: bool = False


@dataclass(frozen=True, slots=True)
class EnqueueOutcome:
    """`counter` is set when the request was enqueued; `known` when its id already existed;
    `handed` when it went straight to a parked receiver (to be confirmed)."""

    counter: int | None
    known: RequestSnapshot | None
    handed: bool = False


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
) -> Call:
    """`max_attempts` 0: at_most_once; else at_least_once, handed out at most that often.
    `now_ms` is the sender's clock (kept as when the request was created); the pickup deadline
    is `pickup_window_ms` after now by Redis's clock."""
    return ENQUEUE.call(
        (keys.request(request_id), keys.levels, keys.sequence, keys.parked, keys.parks,
         keys.take_receipt_prefix, keys.running, keys.limits, keys.level_prefix, keys.lease,
         keys.handoffs),
        (request_id, body, sender, now_ms, handoff_confirm_ms, request_ttl_ms, list_ttl_ms,
         keys.pulse_channel, keys.node_channel_prefix, in_flight_ttl_ms, receipt_ttl_ms,
         receiver_timeout_ms, priority, producer, max_attempts, pickup_window_ms),
    )  # fmt: skip


#: Values per request in an enqueue call; the keys shared by a merged call's requests.
ENQUEUE_ARGS: Final = 16
_ENQUEUE_KEYS: Final = 11
#: Most requests one merged enqueue call carries (merge_enqueues).
MAX_MERGED_ENQUEUES: Final = 64


def _enqueues(call: Call) -> int:
    return (len(call.args) - 3 - int(call.args[2])) // ENQUEUE_ARGS


def merge_enqueues(
    calls: Sequence[Call],
) -> tuple[list[Call], Callable[[list[Reply]], list[Reply]]]:
    """Merge the enqueue calls of `calls` for one endpoint into one call each (at most
    MAX_MERGED_ENQUEUES requests), where the first of them stood: Redis then runs one script
    for many requests, judged in order as if each came alone (enqueue.lua), and shares what
    they read alike (the limits, the clock, the parks, the pulse). Returns the calls to send
    and the function that turns their replies back into one reply per call of `calls` (a
    merged call's error reply goes to each call it merged). As in merge_answers, the calls
    are independent steps, so a request may go earlier than a call queued before it."""
    if sum(1 for call in calls if call.script is ENQUEUE) < 2:
        return list(calls), _same
    sent: list[Call] = []
    carries: list[list[int]] = []
    #: For each merged call (by its place in `sent`): its requests' keys and values so far.
    keys_of: dict[int, list[str | int | bytes]] = {}
    args_of: dict[int, list[str | int | bytes]] = {}
    open_for: dict[tuple[object, ...], int] = {}  # the endpoint's keys -> the call to join
    for i, call in enumerate(calls):
        if call.script is ENQUEUE and _enqueues(call) == 1:
            shared = call.args[4 : 3 + _ENQUEUE_KEYS]
            at = open_for.get(shared)
            if at is not None and len(carries[at]) < MAX_MERGED_ENQUEUES:
                keys_of[at].append(call.args[3])
                args_of[at].extend(call.args[3 + _ENQUEUE_KEYS :])
                carries[at].append(i)
                continue
            open_for[shared] = len(sent)
            keys_of[len(sent)], args_of[len(sent)] = [], []
        sent.append(call)
        carries.append([i])
    for at, more_keys in keys_of.items():
        if more_keys:
            first = sent[at].args
            keys = (*first[3 : 3 + _ENQUEUE_KEYS], *more_keys)
            values = (*first[3 + _ENQUEUE_KEYS :], *args_of[at])
            sent[at] = Call(("EVALSHA", first[1], len(keys), *keys, *values), ENQUEUE)
    return sent, partial(_spread_enqueues, len(calls), carries)


def _spread_enqueues(count: int, carries: list[list[int]], replies: list[Reply]) -> list[Reply]:
    """One reply per call merged (see merge_enqueues): a merged call answers a list of them."""
    out: list[Reply] = [None] * count
    for members, reply in zip(carries, replies, strict=True):
        if len(members) == 1:
            out[members[0]] = reply
        elif isinstance(reply, list) and len(reply) == len(members):
            for member, one in zip(members, reply, strict=True):
                out[member] = one
        else:  # an error reply (or one not shaped as merged): each merged call gets it
            for member in members:
                out[member] = reply
    return out


def merge_calls(calls: Sequence[Call]) -> tuple[list[Call], Callable[[list[Reply]], list[Reply]]]:
    """merge_answers, then merge_enqueues: the calls to send for `calls`, and the function that
    turns their replies back into one per call of `calls`."""
    answered, spread_answers = merge_answers(calls)
    sent, spread_enqueues = merge_enqueues(answered)
    return sent, lambda replies: spread_answers(spread_enqueues(replies))


def parse_enqueue(reply: Reply, endpoint: str = "") -> EnqueueOutcome:
    """Raises QueueFull when the endpoint is at its max_pending."""
    items = _array(reply, "enqueue")
    if len(items) == 2 and _text(items[0]) in ("new", "handed") and isinstance(items[1], int):
        return EnqueueOutcome(counter=items[1], known=None, handed=_text(items[0]) == "handed")
    if len(items) == 3 and _text(items[0]) == "full":
        raise QueueFull(
            f"endpoint {endpoint or '?'} holds {_text(items[1])} queued requests, its "
            f"max_pending is {_text(items[2])}: nothing was enqueued; try again later (or "
            "raise the limit)"
        )
    if items and _text(items[0]) == "known" and len(items) == 4:
        return EnqueueOutcome(counter=None, known=_snapshot(items[1:]))
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
) -> Call:
    """All `items` are queued at `priority` for `producer`, at_least_once when `max_attempts`
    is above 0 (their bodies should say the same); `one_way`: no answer is kept (notify).
    `ledger`: (token, TTL in ms) of the batch's dedup ledger (prq.core.keys.ledger_token): ids a
    receiver took before are not queued again while it lives, though their records are gone.
    `retry_failed`: ids whose record says they ended without an answer for a reason worth
    another try (data loss, a lost or shut-down receiver, attempts used up) are queued afresh.
    `attempt_of`: the prefixes of the nonces of this batch's task attempt and of its task
    (prq.bulk.TaskAttempt; empty: none), which `nonce` begins with.
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
    if shape == "Q2":
        prefix = keys.request_prefix
        head = b"Q2%d," % now_ms
        for place, (request_id, body) in enumerate(items, 1):
            raw = body.encode() if isinstance(body, str) else body
            args += [prefix + request_id, b"%b%d,%b%b" % (head, place, fields, raw)]
    else:
        for request_id, body in items:
            raw = body.encode() if isinstance(body, str) else body
            args += [request_id, fields + raw]
    endpoint_keys: tuple[str, ...] = (
        keys.levels, keys.sequence, keys.request_prefix, keys.limits, keys.level_prefix
    )  # fmt: skip
    if ledger is not None:
        endpoint_keys += (keys.ledger(ledger[0]),)
    return ENQUEUE_MANY.call(endpoint_keys, tuple(args))


#: The smallest batch enqueue_many sends whole, with a shared head (see enqueue_many_call).
SHARED_HEAD_MIN = 8


def _queued_field(name: bytes, value: bytes) -> bytes:
    """One named field of the queued form (_body.lua: its name, its length, ':', its value)."""
    return b"%b%d:%b" % (name, len(value), value)


def parse_enqueue_many(reply: Reply, expected: int) -> BatchOutcome:
    items = _array(reply, "enqueue_many")
    head = items[:7]
    if len(head) < 7 or not all(isinstance(v, int) for v in head):
        raise SerializationError(f"unexpected enqueue_many reply from Redis: {reply!r:.200}")
    counts: list[int] = [v for v in head if isinstance(v, int)]
    accepted, duplicates, counter, refused, depth, gone, repeats = counts
    listed = duplicates + refused + gone + repeats
    if len(items) != 7 + listed or accepted + listed != expected:
        raise SerializationError(f"unexpected enqueue_many reply from Redis: {reply!r:.200}")
    ids = [_text(v) for v in items[7:]]
    cuts = [0, duplicates, duplicates + refused, duplicates + refused + gone, listed]
    dup_ids, refused_ids, gone_ids, repeated_ids = (ids[a:b] for a, b in itertools.pairwise(cuts))
    return BatchOutcome(accepted, dup_ids, counter, refused_ids, depth, gone_ids, repeated_ids)


# -- take ---------------------------------------------------------------------------------------


# (not frozen: a frozen dataclass costs 3.5 times as much to build, one per request taken)
@dataclass(slots=True)
class TakenItem:
    """One request handed out by `take`: its id, raw body, attempt number, when it was
    enqueued (the sender's clock, ms since the epoch; 0 for a hand-off, which waited for no
    take), and its sequence number on the endpoint (0 when unknown)."""

    request_id: str
    body: bytes
    attempt: int
    created_ms: int = 0
    sequence: int = 0


@dataclass(frozen=True, slots=True)
class TakeReply:
    """What one take did: ids skipped, the endpoint's enqueue counter, at_least_once requests
    of silent receivers it queued again or dead-lettered, and the requests handed out."""

    skipped: int
    counter: int
    redelivered: int
    items: list[TakenItem]
    #: Whether the endpoint has a max_in_flight limit (None: this take did not look).
    limited: bool | None = None


@dataclass(frozen=True, slots=True)
class Redelivery:
    """What the scripts that may hand an at_least_once request out again need to know
    (scripts/_redeliver.lua)."""

    request_ttl_extra_ms: int
    list_ttl_ms: int
    dead_letter_ttl_ms: int
    dead_letter_max: int
    #: For a hand-off taken back (scripts/_handoff.lua): its confirmation window, and the TTLs
    #: of a taken request and of a take receipt.
    handoff_confirm_ms: int
    in_flight_ttl_ms: int
    receipt_ttl_ms: int

    @classmethod
    def of(cls, settings: QueueSettings) -> Redelivery:
        return cls(
            int(settings.request_ttl_extra_s * 1000),
            int(settings.list_ttl_s * 1000),
            int(settings.dead_letter_ttl_s * 1000),
            settings.dead_letter_max,
            int(settings.handoff_confirm_s * 1000),
            int(settings.in_flight_ttl_s() * 1000),
            int(settings.receipt_ttl_s() * 1000),
        )


def take_call(
    keys: EndpointKeys,
    owner_token: str,
    receiver: str,
    handoff_confirm_ms: int,
    max_items: int,
    max_scan: int,
    in_flight_ttl_ms: int,
    receipt_ttl_ms: int,
    park_ms: int,
    park_ttl_ms: int,
    receiver_timeout_ms: int,
    redelivery: Redelivery,
) -> Call:
    return TAKE.call(
        (keys.levels, keys.request_prefix, keys.take_receipt(owner_token), keys.parked,
         keys.parks, keys.sequence, keys.running, keys.limits, keys.level_prefix, keys.lease,
         *keys.dead, keys.handoffs),
        (owner_token, receiver, handoff_confirm_ms, max_items, max_scan, in_flight_ttl_ms,
         receipt_ttl_ms, park_ms, park_ttl_ms, receiver_timeout_ms, redelivery.request_ttl_extra_ms,
         redelivery.dead_letter_ttl_ms, redelivery.dead_letter_max, keys.pulse_channel,
         keys.node_channel_prefix),
    )  # fmt: skip


#: Values before the first item of a take reply: skipped, counter, redelivered, limited.
_TAKE_HEAD: Final = 4


def parse_take(reply: Reply) -> TakeReply:
    items = _array(reply, "take")
    head = _TAKE_HEAD
    if len(items) < head or not all(isinstance(v, int) for v in items[:head]):
        raise SerializationError(f"unexpected take reply from Redis: {reply!r:.200}")
    if (len(items) - head) % 5:
        raise SerializationError(f"unexpected take reply from Redis: {reply!r:.200}")
    taken = []
    for i in range(head, len(items), 5):
        body = items[i + 1]
        created, sequence = _text(items[i + 3]), _text(items[i + 4])
        taken.append(
            TakenItem(
                request_id=_text(items[i]),
                body=body if isinstance(body, bytes) else _text(body).encode(),
                attempt=int(_text(items[i + 2]) or 1),
                created_ms=int(created) if created.isdigit() else 0,
                sequence=int(sequence) if sequence.isdigit() else 0,
            )
        )
    skipped, counter, redelivered, limited = items[:head]
    assert isinstance(skipped, int) and isinstance(counter, int)
    assert isinstance(redelivered, int) and isinstance(limited, int)
    return TakeReply(skipped, counter, redelivered, taken, None if limited < 0 else limited > 0)


# -- apply_response -----------------------------------------------------------------------------

#: What apply_response can answer (see apply_response.lua).
APPLY_OUTCOMES: Final = frozenset({"ok", "replay", "duplicate", "stale", "fenced", "unknown"})


#: Values per answer in an apply_response call, after its keys and its three shared values.
ANSWER_ARGS: Final = 5
#: Most answers one merged apply_response call carries (merge_answers).
MAX_MERGED_ANSWERS: Final = 256
#: Most request ids one read_response call reads (bounds the time Redis spends in one script).
MAX_READ_IDS: Final = 256
_ANSWER_KEYS: Final = 5
#: EVALSHA, sha, numkeys, the keys, the four values every answer of a call shares.
_ANSWER_HEAD: Final = 3 + _ANSWER_KEYS + 4


def apply_response_call(
    keys: EndpointKeys,
    request_id: str,
    owner_token: str,
    response: bytes,
    response_ttl_ms: int,
    now_ms: int,
    pulse_inline_limit_bytes: int,
    unlimited: bool = False,
) -> Call:
    """One answer; answers to one endpoint sent together go as one call (merge_answers).
    `unlimited`: the receiver's last take found no max_in_flight limit on the endpoint, so the
    answer need not look for receivers waiting for the slot it frees."""
    return APPLY_RESPONSE.call(
        (keys.running, keys.limits, keys.levels, keys.lease, keys.request_prefix),
        (
            keys.node_channel_prefix,
            pulse_inline_limit_bytes,
            keys.pulse_channel,
            0 if unlimited else 1,
            request_id,
            owner_token,
            response,
            response_ttl_ms,
            now_ms,
        ),
    )


def parse_apply_response(reply: Reply) -> str:
    """The status of a one-answer apply_response call."""
    statuses = reply if isinstance(reply, list) else [reply]
    outcome = _text(statuses[0]) if len(statuses) == 1 else ""
    if outcome not in APPLY_OUTCOMES:
        raise SerializationError(f"unexpected apply_response reply from Redis: {reply!r:.200}")
    return outcome


def _answers(call: Call) -> int:
    return (len(call.args) - _ANSWER_HEAD) // ANSWER_ARGS


def merge_answers(calls: Sequence[Call]) -> tuple[list[Call], Callable[[list[Reply]], list[Reply]]]:
    """Merge the apply_response calls of `calls` that answer on one endpoint into one call each
    (at most MAX_MERGED_ANSWERS answers), where the first of them stood: Redis then runs one
    script for many answers, not one per answer. Returns the calls to send and the function
    that turns their replies back into one reply per call of `calls` (a merged call's error
    reply goes to each call it merged). Calls are independent steps (the I/O layer's batches),
    so an answer may go earlier than a call queued before it; nothing else moves."""
    if sum(1 for call in calls if call.script is APPLY_RESPONSE) < 2:
        return list(calls), _same
    sent: list[Call] = []
    #: For each call sent: the indexes of `calls` it carries (one, unless merged).
    carries: list[list[int]] = []
    #: For each answer call sent (by its place in `sent`): the answers it holds, and the
    #: arguments of the answers merged into it.
    held: dict[int, int] = {}
    more: dict[int, list[str | int | bytes]] = {}
    open_for: dict[tuple[object, ...], int] = {}  # shared head -> the call answers join
    for i, call in enumerate(calls):
        if call.script is APPLY_RESPONSE:
            head, n = call.args[:_ANSWER_HEAD], _answers(call)
            at = open_for.get(head)
            if at is not None and held[at] + n <= MAX_MERGED_ANSWERS:
                more[at].extend(call.args[_ANSWER_HEAD:])
                held[at] += n
                carries[at].append(i)
                continue
            open_for[head] = len(sent)
            held[len(sent)], more[len(sent)] = n, []
        sent.append(call)
        carries.append([i])
    for at, args in more.items():
        if args:
            sent[at] = Call((*sent[at].args, *args), APPLY_RESPONSE)

    return sent, partial(_spread, calls, carries)


def _spread(calls: Sequence[Call], carries: list[list[int]], replies: list[Reply]) -> list[Reply]:
    """One reply per call of `calls`, from the replies of the calls sent for them (`carries`:
    which of `calls` each one sent carries; see merge_answers)."""
    out: list[Reply] = [None] * len(calls)
    for members, reply in zip(carries, replies, strict=True):
        if len(members) == 1:
            out[members[0]] = reply
        elif not isinstance(reply, list):  # an error reply: each merged call gets it
            for member in members:
                out[member] = reply
        else:
            at = 0
            for member in members:
                n = _answers(calls[member])
                out[member] = reply[at : at + n]
                at += n
    return out


def _same(replies: list[Reply]) -> list[Reply]:
    return replies


# -- withdraw / read_response -------------------------------------------------------------------


def withdraw_call(
    keys: EndpointKeys,
    request_id: str,
    reason: str,
    tombstone_ttl_ms: int,
    now_ms: int,
    nonce: str,
) -> Call:
    return WITHDRAW.call(
        (keys.request(request_id), keys.levels, keys.level_prefix, keys.running, keys.handoffs),
        (reason, tombstone_ttl_ms, now_ms, keys.node_channel_prefix, request_id, nonce),
    )


def parse_withdraw(reply: Reply) -> tuple[RequestSnapshot, bool]:
    """Return the request's snapshot and whether this withdraw (or cancel) call did it."""
    items = _array(reply, "withdraw")
    if len(items) != 4 or not isinstance(items[3], int):
        raise SerializationError(f"unexpected withdraw reply from Redis: {reply!r:.200}")
    return _snapshot(items[:3]), items[3] == 1


def read_response_call(
    keys: EndpointKeys,
    request_ids: Sequence[str],
    receiver_timeout_ms: int,
    redelivery: Redelivery,
) -> Call:
    """Where the requests stand (one or many, of one endpoint: at most MAX_READ_IDS); the
    reply is one snapshot per id (parse_snapshots)."""
    if not 0 < len(request_ids) <= MAX_READ_IDS:
        raise ValueError(f"read_response reads 1..{MAX_READ_IDS} ids, not {len(request_ids)}")
    return READ_RESPONSE.call(
        (keys.request_prefix, keys.running, keys.lease, keys.levels, keys.level_prefix,
         *keys.dead, keys.parked, keys.parks, keys.take_receipt_prefix, keys.handoffs),
        (receiver_timeout_ms, keys.node_channel_prefix,
         redelivery.request_ttl_extra_ms, redelivery.list_ttl_ms,
         redelivery.dead_letter_ttl_ms, redelivery.dead_letter_max, keys.pulse_channel,
         redelivery.handoff_confirm_ms, redelivery.in_flight_ttl_ms, redelivery.receipt_ttl_ms,
         *request_ids),
    )  # fmt: skip


# -- beat / cancel / canary ---------------------------------------------------------------------


def beat_call(
    keys: EndpointKeys,
    request_id: str,
    role: str,
    owner_token: str,
    record: bool,
    sender_timeout_ms: int,
    in_flight_ttl_ms: int,
    list_ttl_ms: int,
    progress: str = "",
) -> Call:
    return BEAT.call(
        (keys.request(request_id), keys.running, keys.lease),
        (role, owner_token, 1 if record else 0, sender_timeout_ms, in_flight_ttl_ms,
         keys.node_channel_prefix, request_id, list_ttl_ms, progress),
    )  # fmt: skip


def parse_beat(reply: Reply) -> tuple[str, str, tuple[int, int] | None]:
    """Return (state, reason, progress) as a beat saw them; progress is the receiver's last
    (bytes read, bytes in all) of the request's DataStreams, None when not reported (or
    unreadable: it is advisory)."""
    items = _array(reply, "beat")
    if len(items) != 3:
        raise SerializationError(f"unexpected beat reply from Redis: {reply!r:.200}")
    done, _, total = _text(items[2]).partition("/")
    progress = (int(done), int(total)) if done.isdigit() and total.isdigit() else None
    return _text(items[0]), _text(items[1]), progress


def cancel_call(
    keys: EndpointKeys,
    request_id: str,
    reason: str,
    marker_ttl_ms: int,
    nonce: str,
) -> Call:
    return CANCEL.call(
        (
            keys.request(request_id),
            keys.running,
            keys.levels,
            keys.level_prefix,
            keys.lease,
            keys.handoffs,
        ),
        (reason, marker_ttl_ms, keys.node_channel_prefix, request_id, nonce),
    )


def hand_back_call(
    keys: EndpointKeys, request_id: str, owner_token: str, redelivery: Redelivery
) -> Call:
    """Give back a held request on shutdown (hand_back.lua); the reply is its state after."""
    return HAND_BACK.call(
        (keys.request(request_id), keys.running, keys.lease, keys.levels, keys.level_prefix,
         *keys.dead),
        (request_id, owner_token, redelivery.request_ttl_extra_ms, redelivery.list_ttl_ms,
         redelivery.dead_letter_ttl_ms, redelivery.dead_letter_max, keys.pulse_channel,
         keys.node_channel_prefix),
    )  # fmt: skip


def unpark_call(keys: EndpointKeys, owner_token: str, redelivery: Redelivery) -> Call:
    """Withdraw the park of a take that will never return what it got (unpark.lua): what the
    token was handed or took goes to another receiver, uncounted; the reply is how many."""
    return UNPARK.call(
        (keys.parked, keys.parks, keys.take_receipt(owner_token), keys.request_prefix,
         keys.running, keys.handoffs, keys.levels, keys.level_prefix, keys.take_receipt_prefix,
         keys.lease),
        (owner_token, redelivery.handoff_confirm_ms, redelivery.in_flight_ttl_ms,
         redelivery.receipt_ttl_ms, redelivery.list_ttl_ms, redelivery.request_ttl_extra_ms,
         keys.pulse_channel, keys.node_channel_prefix),
    )  # fmt: skip


def parse_unpark(reply: Reply) -> int:
    if not isinstance(reply, int):
        raise SerializationError(f"unexpected unpark reply from Redis: {reply!r:.200}")
    return reply


def presence_call(keys: EndpointKeys, node_id: str, stale_ms: int, ttl_ms: int) -> Call:
    return PRESENCE.call((keys.receivers,), (node_id, stale_ms, ttl_ms))


def canary_call(key: str, ttl_ms: int, last: int | None) -> Call:
    return CANARY.call((key,), (ttl_ms, -1 if last is None else last))


def parse_canary(reply: Reply) -> int:
    if not isinstance(reply, int):
        raise SerializationError(f"unexpected canary reply from Redis: {reply!r:.200}")
    return reply


def _snapshot(items: list[Reply]) -> RequestSnapshot:
    raw = items[1]
    return RequestSnapshot(
        state=_text(items[0]),
        response=raw if isinstance(raw, bytes) else _text(raw).encode(),
        reason=_text(items[2]),
    )


def parse_snapshot(reply: Reply) -> RequestSnapshot:
    """Parse the {state, response, reason, pickup left, redelivered} reply of read_response;
    state "handed" is a hand-off waiting for its receiver's confirmation (not picked up)."""
    items = _array(reply, "request state")
    if len(items) != 5:
        raise SerializationError(f"unexpected request state reply from Redis: {reply!r:.200}")
    snapshot = replace(_snapshot(items[:3]), redelivered=items[4] == 1)
    left = items[3]
    if not isinstance(left, int):
        return snapshot
    return replace(snapshot, pickup_left_ms=left)


def parse_snapshots(reply: Reply, count: int) -> list[RequestSnapshot]:
    """Parse read_response's reply for `count` ids: one snapshot each, in order."""
    items = _array(reply, "request states")
    if len(items) != count:
        raise SerializationError(
            f"read_response answered {len(items)} states for {count} ids: {reply!r:.200}"
        )
    return [parse_snapshot(item) for item in items]
