"""The protocol, written once: each operation is a generator of effects (sans I/O).

A flow yields `Exec` (send these calls in one round trip; receive the replies), `Wait` (wait
for a pulse signal or a timeout) and `Offload` (blocking file I/O: reading back a body kept
beside Redis, prq.core.bodies), and returns its result. `AsyncQueue` drives flows with
`await`, `Queue` drives the same flows with blocking calls; nothing else differs between them.

Sender life of one call (`call_flow`):

    enqueue ─▶ wait(pulse | poll) ─▶ response in pulse? ─yes─▶ done
                    ▲                       │ no
                    └── queued/taken ◀── read_response ─▶ done / withdrawn / missing
    queued past the pickup deadline ─▶ withdraw ─▶ PickupTimeout (or, if taken meanwhile, wait on)
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from prq.core import bodies
from prq.core.config import QueueSettings
from prq.core.errors import (
    ConfigurationError,
    PrqError,
    QueueUnavailable,
    SerializationError,
)
from prq.core.keys import KeySchema, decode_endpoint, encode_endpoint
from prq.core.lifecycle import RequestState, RequestStatus
from prq.core.models import Request, Response, decode_response
from prq.core.names import readable_endpoint
from prq.core.records import QUEUED_HEAD_BYTES, queued_head
from prq.protocol.effects import Call, Exec, Flow, Offload, Reply, Wait, Waitable
from prq.protocol.outcomes import open_response, resolve, response_of
from prq.protocol.scripts import (
    HANDED,
    Redelivery,
    RequestSnapshot,
    TakenItem,
    apply_response_call,
    cancel_call,
    enqueue_call,
    parse_apply_response,
    parse_enqueue,
    parse_snapshots,
    parse_take,
    parse_withdraw,
    read_response_call,
    take_call,
    withdraw_call,
)
from prq.protocol.signing import Signer

if TYPE_CHECKING:
    from prq.protocol.stream_keeper import StreamKeeper

__all__ = [
    "Context",
    "TakeResult",
    "call_flow",
    "cancel_flow",
    "layout_flow",
    "locate_flow",
    "new_token",
    "respond_flow",
    "status_flow",
    "take_flow",
    "withdraw_flow",
    "withdraw_own_flow",
]

#: How many ids one take may pop while skipping dead ones.
DEFAULT_TAKE_SCAN = 100
#: Most endpoints asked for a request id that has no locator (see locate_flow).
MAX_PROBED_ENDPOINTS = 1000
#: How often a waiting take checks whether its server loop was asked to stop.
DEFAULT_STOP_CHECK_S = 0.25


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


@dataclass(frozen=True, slots=True)
class Context:
    """What flows need to know about the node: its keys, settings, id, clocks and signer."""

    keys: KeySchema
    settings: QueueSettings
    node_id: str
    wall_ms: Callable[[], int] = field(default=lambda: int(time.time() * 1000))
    monotonic: Callable[[], float] = time.monotonic
    #: Signs what this node writes and checks what it reads (None: no signing key).
    signer: Signer | None = None
    #: Reads back bodies kept beside Redis (prq.core.bodies); None: such a body is an error.
    bodies: StreamKeeper | None = None
    #: The endpoints this node's last take found without a max_in_flight limit: its answers
    #: there skip looking for receivers that wait for a free slot (take_flow keeps it).
    unlimited: set[str] = field(default_factory=set)


def new_token() -> str:
    """A fresh owner token for a take."""
    return uuid.uuid4().hex


def _exec(*calls: Call) -> Exec:
    return Exec(calls)


def _first(replies: object) -> Reply:
    assert isinstance(replies, list)
    reply: Reply = replies[0]
    return reply


def _wait(signal: Waitable, seen: int, timeout_s: float) -> Wait:
    return Wait(signal, seen, max(0.0, timeout_s))


def _enqueue_calls(
    ctx: Context, request: Request, body: bytes, pickup_timeout_s: float, register: bool
) -> Exec:
    """The enqueue script, for one round trip with what goes beside it: the endpoint's entry
    in the registry when `register` (the node's first use of it: status and cancel by id from
    any node find requests through the registry, and an endpoint is listed as soon as anything
    is queued for it), and the id → endpoint locator with `request_locators`."""
    settings = ctx.settings
    keys = ctx.keys.endpoint(request.endpoint)
    now_ms = ctx.wall_ms()
    request_ttl_s = settings.request_ttl_s(pickup_timeout_s)
    attempts = settings.max_attempts if request.delivery == "at_least_once" else 0
    if ctx.signer is not None:
        valid_s = settings.signature_ttl_s(pickup_timeout_s, max(1, attempts))
        body = ctx.signer.sign("request", request.id, request.endpoint, body,
                               now_ms + _ms(valid_s))  # fmt: skip
    calls = [
        enqueue_call(
            keys,
            request.id,
            body,
            ctx.node_id,
            now_ms,
            _ms(pickup_timeout_s),
            _ms(request_ttl_s),
            _ms(settings.list_ttl_s),
            _ms(settings.in_flight_ttl_s()),
            _ms(settings.receipt_ttl_s()),
            _ms(settings.handoff_confirm_s),
            _ms(settings.receiver_timeout_s),
            request.priority,
            request.producer or ctx.node_id,
            attempts,
        )
    ]
    if register:
        calls += registry_calls(ctx.keys, settings, [request.endpoint], now_ms)
    calls += locator_calls(ctx.keys, settings, request.id, request.endpoint, pickup_timeout_s)
    return _exec(*calls)


def locator_calls(
    keys: KeySchema, settings: QueueSettings, request_id: str, endpoint: str, pickup_s: float
) -> list[Call]:
    """The id → endpoint locator of a request, with `request_locators` (else nothing)."""
    if not settings.request_locators:
        return []
    ttl_ms = _ms(settings.locator_ttl_s(pickup_s))
    return [Call(("SET", keys.locator(request_id), endpoint, "PX", ttl_ms))]


def layout_flow(ctx: Context, endpoint: str) -> Flow[None]:
    """Refuse an endpoint that still holds the previous layout's scheduling lanes (ids queued
    there would never be taken by this version): one EXISTS, sent once per endpoint per node
    (its first use), before anything is queued or taken. Raises ConfigurationError."""
    keys = ctx.keys.endpoint(endpoint)
    replies = yield Exec((Call(("EXISTS", keys.old_levels)),))
    assert isinstance(replies, list)
    if replies[0]:
        raise ConfigurationError(old_layout_message(endpoint, keys.old_levels, keys.tag))


def old_layout_message(endpoint: str, old_levels: str, tag: str) -> str:
    """What to do about an endpoint whose requests were queued by the previous layout."""
    return (
        f"endpoint {endpoint!r} holds requests queued by a previous prq version, in the "
        f"previous scheduling layout ({old_levels} exists), which this version does not read. "
        "Drain that endpoint first with receivers of the previous prq version (stop its "
        "senders; when the previous receivers have taken everything, that key is gone), or, "
        f"if nothing queued there is worth keeping, delete {old_levels} and the keys matching "
        f"{tag}:q:* (those requests then expire unanswered); then start again."
    )


def registry_calls(
    keys: KeySchema, settings: QueueSettings, endpoints: Sequence[str], now_ms: int
) -> list[Call]:
    """Add `endpoints` to the registry (`prq:endpoints`, scored by last use: newest wins)."""
    members: list[str | int] = []
    for endpoint in endpoints:
        members += [now_ms, encode_endpoint(endpoint)]
    return [
        Call(("ZADD", keys.endpoints, "GT", *members)),
        Call(("PEXPIRE", keys.endpoints, _ms(settings.list_ttl_s))),
    ]


def _pulse_response(ctx: Context, signal: Waitable, request: Request) -> Flow[Response | None]:
    """The response carried by the last pulse, if it is this request's (else read Redis)."""
    payload = signal.payload
    if not payload:
        return None
    try:
        data = open_response(ctx.signer, request.id, request.endpoint, payload)
        response = decode_response(bodies.stub(data))
    except SerializationError:
        return None  # a garbled or forged pulse: the read that follows is authoritative
    if response.id != request.id:
        return None
    if not bodies.is_spilled(data):
        return response
    return (yield from _read_response(ctx, request, data))


def _read_response(ctx: Context, request: Request, data: bytes) -> Flow[Response]:
    """An opened response's JSON as a Response; a body kept beside Redis is read back from
    the store first, off the event loop (it may have run: maybe_executed)."""
    if bodies.is_spilled(data) and ctx.bodies is not None:
        try:
            loaded = yield Offload(
                partial(ctx.bodies.load_body, data, f"the response to {request.id}")
            )
        except PrqError as exc:
            exc.maybe_executed = True
            raise
        assert isinstance(loaded, bytes)
        data = loaded
    return response_of(data, request.id)


def _outcome(ctx: Context, snapshot: RequestSnapshot, request: Request) -> Flow[Response | None]:
    """resolve(), reading a response kept beside Redis back from the store."""
    if snapshot.state != RequestState.DONE:
        return resolve(snapshot, request.id, request.endpoint, ctx.signer)
    data = open_response(ctx.signer, request.id, request.endpoint, snapshot.response)
    return (yield from _read_response(ctx, request, data))


@dataclass(slots=True)
class _CallClock:
    """The deadlines of one call, on the monotonic clock.

    Polls run on a fixed grid (every `poll_interval_s` from the start), so a late read does not
    push every later one back. `last_contact` is when Redis last answered this call: a caller
    judges its receiver only if it was itself in touch with Redis a moment ago, so a pause of
    Redis (or of this node) that kept everyone from beating declares nobody dead.
    """

    pickup_deadline: float
    call_deadline: float | None
    poll_interval_s: float
    next_poll: float
    last_contact: float
    picked_up: bool = False
    #: Handed out again after its receiver went silent (at_least_once): it may have run.
    redelivered: bool = False
    #: Handed to a parked receiver: read Redis once its confirmation is overdue, so a hand-off
    #: to a receiver that died is taken back then (read_response.lua), not a poll later.
    handoff_check: float | None = None

    def saw(self, handed: bool, now: float, confirm_s: float) -> None:
        """Redis answered now; `handed`: the request waits for a receiver's confirmation."""
        self.last_contact = now
        self.handoff_check = now + confirm_s + min(0.1, confirm_s) if handed else None

    def wake_at(self, now: float) -> float:
        while self.next_poll <= now:
            self.next_poll += self.poll_interval_s
        wake = self.next_poll
        if self.handoff_check is not None:
            wake = min(wake, self.handoff_check)
        if not self.picked_up:
            wake = min(wake, self.pickup_deadline)
        if self.call_deadline is not None:
            wake = min(wake, self.call_deadline)
        return wake

    def may_judge(self, now: float) -> bool:
        return now - self.last_contact <= 2 * self.poll_interval_s + 1.0


def call_flow(
    ctx: Context,
    request: Request,
    body: bytes,
    signal: Waitable,
    pickup_timeout_s: float,
    timeout_s: float | None,
    on_counter: Callable[[int | None], None] | None = None,
    on_redelivered: Callable[[str], None] | None = None,
    register: bool = False,
    layout: Flow[None] | None = None,
) -> Flow[Response]:
    """Enqueue `request` and wait for its outcome (see the module docstring).

    `register`: add the endpoint to the registry with the enqueue (the node's first use of it).
    `layout`: a check that runs before anything is written (the node's layout check, which
    raises ConfigurationError for an endpoint holding the previous layout).
    `on_counter` is called once the enqueue step answered, with the endpoint's enqueue counter
    (for the data-loss watch), or None when the id was known already;
    `on_redelivered` gets the request's new state when this call's poll handed it out again
    ("queued") or dead-lettered it ("cancelled") because its receiver went silent
    (at_least_once)."""
    started = ctx.monotonic()
    clock = _CallClock(
        pickup_deadline=started + pickup_timeout_s,
        call_deadline=None if timeout_s is None else started + timeout_s,
        poll_interval_s=ctx.settings.poll_interval_s,
        next_poll=started + ctx.settings.poll_interval_s,
        last_contact=started,
    )
    seen = signal.generation
    if layout is not None:
        yield from layout
    try:
        return (
            yield from _await_outcome(
                ctx,
                request,
                _enqueue_calls(ctx, request, body, pickup_timeout_s, register),
                signal,
                seen,
                pickup_timeout_s,
                timeout_s,
                clock,
                on_counter,
                on_redelivered,
            )
        )
    except QueueUnavailable as exc:
        raise QueueUnavailable(
            f"{exc} Request {request.id} may have been enqueued and may still run; retrying "
            "with the same request id is safe (it is never enqueued twice).",
            maybe_executed=True,
        ) from exc


def _await_outcome(
    ctx: Context,
    request: Request,
    enqueue: Exec,
    signal: Waitable,
    seen: int,
    pickup_timeout_s: float,
    timeout_s: float | None,
    clock: _CallClock,
    on_counter: Callable[[int | None], None] | None,
    on_redelivered: Callable[[str], None] | None,
) -> Flow[Response]:
    keys = ctx.keys.endpoint(request.endpoint)
    replies = yield enqueue
    outcome = parse_enqueue(_first(replies), request.endpoint)
    clock.saw(outcome.handed, ctx.monotonic(), ctx.settings.handoff_confirm_s)
    if on_counter is not None:
        on_counter(outcome.counter)
    if outcome.known is not None:
        known = yield from _outcome(ctx, outcome.known, request)
        if known is not None:
            return known
        clock.picked_up = outcome.known.state == RequestState.TAKEN

    while True:
        now = ctx.monotonic()
        yield _wait(signal, seen, clock.wake_at(now) - now)
        if signal.generation != seen:
            seen = signal.generation
            response = yield from _pulse_response(ctx, signal, request)
            if response is not None:
                return response

        judge = clock.picked_up and clock.may_judge(ctx.monotonic())
        read = read_response_call(
            keys,
            (request.id,),
            _ms(ctx.settings.receiver_timeout_s) if judge else 0,
            Redelivery.of(ctx.settings),
        )
        (snapshot,) = parse_snapshots(_first((yield _exec(read))), 1)
        clock.saw(snapshot.state == HANDED, ctx.monotonic(), ctx.settings.handoff_confirm_s)
        if snapshot.redelivered and on_redelivered is not None:
            on_redelivered(snapshot.state)
        result = yield from _outcome(ctx, snapshot, request)
        if clock.picked_up and snapshot.state in (RequestState.QUEUED, HANDED):
            # handed out again (at_least_once), or given back unrun by a take cut short: it
            # waits for a pickup afresh
            clock.picked_up, clock.redelivered = False, True
            clock.pickup_deadline = ctx.monotonic() + pickup_timeout_s
        if result is None:
            clock.picked_up = clock.picked_up or snapshot.state == RequestState.TAKEN
            result = yield from _past_deadlines(ctx, request, clock, timeout_s)
        if result is not None:
            return result


def _past_deadlines(
    ctx: Context, request: Request, clock: _CallClock, timeout_s: float | None
) -> Flow[Response | None]:
    """Act on a passed pickup or call deadline: withdraw, or raise CallTimeout."""
    now = ctx.monotonic()
    if not clock.picked_up and now >= clock.pickup_deadline:
        why = "redelivery_timeout" if clock.redelivered else "pickup_timeout"
        snapshot = yield from withdraw_flow(ctx, request, why)
        result = yield from _outcome(ctx, snapshot, request)
        if result is not None:
            return result
        clock.picked_up = True  # taken just before the deadline: it keeps waiting
    if clock.call_deadline is not None and now >= clock.call_deadline:
        snapshot, _mine = yield from _cancel(ctx, request.endpoint, request.id, "call_timeout")
        return (yield from _outcome(ctx, snapshot, request))  # raises unless it was answered
    return None


def withdraw_flow(ctx: Context, request: Request, reason: str) -> Flow[RequestSnapshot]:
    """Withdraw a request not yet picked up; the snapshot says where it stands now."""
    snapshot, _mine = yield from _withdraw(ctx, request.endpoint, request.id, reason)
    return snapshot


def withdraw_own_flow(
    ctx: Context, endpoint: str, request_id: str, reason: str = "cancelled"
) -> Flow[bool]:
    """Withdraw a request not yet picked up; True if this call withdrew it."""
    _snapshot, mine = yield from _withdraw(ctx, endpoint, request_id, reason)
    return mine


def cancel_flow(
    ctx: Context,
    request_id: str,
    endpoint: str | None,
    reason: str = "cancelled",
    on_cancelled: Callable[[str], None] | None = None,
) -> Flow[bool]:
    """Cancel a request from any node, before or after pickup; True if this call did it
    (then `on_cancelled` is told the endpoint).

    `endpoint` None means look it up by id (the locator key)."""
    if endpoint is None:
        endpoint = yield from locate_flow(ctx, request_id)
        if endpoint is None:
            return False
    _snapshot, mine = yield from _cancel(ctx, endpoint, request_id, reason)
    if mine and on_cancelled is not None:
        on_cancelled(endpoint)
    return mine


def _cancel(
    ctx: Context, endpoint: str, request_id: str, reason: str
) -> Flow[tuple[RequestSnapshot, bool]]:
    replies = yield _exec(
        cancel_call(
            ctx.keys.endpoint(endpoint),
            request_id,
            reason,
            _ms(ctx.settings.cancel_marker_ttl_s),
            uuid.uuid4().hex,
        )
    )
    return parse_withdraw(_first(replies))


def _withdraw(
    ctx: Context, endpoint: str, request_id: str, reason: str
) -> Flow[tuple[RequestSnapshot, bool]]:
    replies = yield _exec(
        withdraw_call(
            ctx.keys.endpoint(endpoint),
            request_id,
            reason,
            _ms(ctx.settings.cancel_marker_ttl_s),
            ctx.wall_ms(),
            uuid.uuid4().hex,
        )
    )
    return parse_withdraw(_first(replies))


@dataclass(frozen=True, slots=True)
class TakeResult:
    """What one take handed out, under which owner token."""

    token: str
    items: list[TakenItem]
    #: The endpoint's enqueue counter as the last take saw it.
    counter: int | None = None
    #: at_least_once requests of silent receivers the takes queued again or dead-lettered.
    redelivered: int = 0


def take_flow(
    ctx: Context,
    endpoint: str,
    token: str,
    signal: Waitable,
    max_items: int,
    timeout_s: float,
    should_stop: Callable[[], bool] | None = None,
) -> Flow[TakeResult]:
    """Take up to `max_items` requests, waiting up to `timeout_s` for the first.

    When there is nothing to take, the take parks the token: a request enqueued meanwhile is
    handed to it, and its node pulsed. The next take collects the hand-off from the token's
    receipt, which confirms it (scripts/_handoff.lua): a request is never run on the strength
    of a pulse alone, so one handed to a receiver that died while parked goes to another
    receiver instead of being lost with it. Between takes nothing is sent to Redis until a
    pulse or a hand-off arrives or the poll interval passes; `should_stop` is checked at least
    every `DEFAULT_STOP_CHECK_S`. The last take (at the deadline, or on stop) does not park, and
    returns whatever the token was handed.
    """
    settings = ctx.settings
    keys = ctx.keys.endpoint(endpoint)
    deadline = ctx.monotonic() + timeout_s
    final = timeout_s <= 0
    redelivered = 0
    redelivery = Redelivery.of(settings)
    while True:
        seen = signal.generation
        now = ctx.monotonic()
        park_s = 0.0 if final else min(settings.poll_interval_s, deadline - now)
        replies = yield Exec(
            (take_call(
                keys,
                token,
                ctx.node_id,
                _ms(settings.handoff_confirm_s),
                max_items,
                DEFAULT_TAKE_SCAN,
                _ms(settings.in_flight_ttl_s()),
                _ms(settings.receipt_ttl_s()),
                _ms(park_s) if park_s > 0 else 0,
                _ms(settings.list_ttl_s),
                _ms(settings.receiver_timeout_s),
                redelivery,
            ),),
            express=final,  # (a take ahead, or the last one: not worth waiting for answers)
        )  # fmt: skip
        taken = parse_take(_first(replies))
        redelivered += taken.redelivered
        if taken.limited:
            ctx.unlimited.discard(endpoint)
        elif taken.limited is not None:
            ctx.unlimited.add(endpoint)
        if taken.items or final:
            return TakeResult(token, taken.items, taken.counter, redelivered)
        if taken.skipped >= DEFAULT_TAKE_SCAN:
            continue  # a run of dead ids: keep taking before waiting
        next_poll = ctx.monotonic() + park_s
        while signal.generation == seen:
            now = ctx.monotonic()
            if now >= deadline or (should_stop is not None and should_stop()):
                final = True
                break
            if now >= next_poll:
                break
            timeout = min(next_poll, deadline) - now
            if should_stop is not None:
                timeout = min(timeout, DEFAULT_STOP_CHECK_S)
            yield _wait(signal, seen, timeout)


def respond_flow(
    ctx: Context,
    endpoint: str,
    request_id: str,
    owner_token: str,
    response: bytes,
    ttl_s: float | None = None,
) -> Flow[str]:
    """Store a response as the request's owner, kept `ttl_s` (None: the response TTL; signed
    to expire then too, with a signing key); returns the script's outcome."""
    keep_ms = _ms(ctx.settings.response_ttl_s if ttl_s is None else ttl_s)
    if ctx.signer is not None:
        expiry_ms = ctx.wall_ms() + keep_ms
        response = ctx.signer.sign("response", request_id, endpoint, response, expiry_ms)
    replies = yield _exec(
        apply_response_call(
            ctx.keys.endpoint(endpoint),
            request_id,
            owner_token,
            response,
            keep_ms,
            ctx.wall_ms(),
            ctx.settings.pulse_inline_limit_bytes,
            unlimited=endpoint in ctx.unlimited,
        )
    )
    return parse_apply_response(_first(replies))


def locate_flow(ctx: Context, request_id: str) -> Flow[str | None]:
    """The endpoint a request id was sent to, or None if Redis does not know it.

    Requests carry no locator by default (`QueueSettings.request_locators`): the endpoints in
    the registry are asked, newest first and at most MAX_PROBED_ENDPOINTS, whether they hold
    the id, in two round trips. A request with a locator is found by the first already (the
    locator is read with the registry).
    """
    replies = yield _exec(
        Call(("GET", ctx.keys.locator(request_id))),
        Call(("ZRANGE", ctx.keys.endpoints, 0, MAX_PROBED_ENDPOINTS - 1, "REV")),
    )
    assert isinstance(replies, list)
    endpoint, registered = replies
    if isinstance(endpoint, bytes):
        return endpoint.decode("utf-8", errors="replace")
    names = _registered(registered)
    if not names:
        return None
    probes = [Call(("EXISTS", ctx.keys.endpoint(name).request(request_id))) for name in names]
    replies = yield _exec(*probes)
    assert isinstance(replies, list)
    return next((name for name, found in zip(names, replies, strict=True) if found == 1), None)


def _registered(reply: Reply) -> list[str]:
    """Endpoint names from a registry read; entries that are not valid names are skipped."""
    names: list[str] = []
    for item in reply if isinstance(reply, list) else []:
        try:
            name = decode_endpoint(item.decode() if isinstance(item, bytes) else str(item))
            names.append(readable_endpoint(name))
        except (ValueError, PrqError):
            continue
    return names


#: How many times status() reads a record that changes its form meanwhile.
STATUS_READS = 3
#: Fields status() reads from a request hash, in order.
_STATUS_FIELDS = ("st", "why", "att", "ct", "tk", "dn")


def _record_fields_flow(key: str, names: Sequence[str]) -> Flow[Reply]:
    """HMGET of `names` for a record in either form: a request queued by BulkClient is a
    string until its pickup (prq.core.records), whose head is read, not its body. Should a script
    turn it into a hash between the two reads, it is read again (at most STATUS_READS times)."""
    for _ in range(STATUS_READS):
        kind = _first((yield _exec(Call(("TYPE", key)))))
        if kind not in (b"string", "string"):
            return _first((yield _exec(Call(("HMGET", key, *names)))))
        try:
            head = _first((yield _exec(Call(("GETRANGE", key, 0, QUEUED_HEAD_BYTES - 1)))))
        except PrqError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            continue  # a hash now
        if isinstance(head, bytes):
            fields = queued_head(head) or {"st": b"queued"}  # damaged: still queued
            return [fields.get(name) for name in names]
    raise SerializationError(f"record {key} kept changing its form while it was read")


def status_flow(ctx: Context, request_id: str, endpoint: str | None) -> Flow[RequestStatus]:
    """Where a request stands; `endpoint` None means look it up by id."""
    if endpoint is None:
        endpoint = yield from locate_flow(ctx, request_id)
        if endpoint is None:
            return RequestStatus(id=request_id, state=RequestState.UNKNOWN)
    key = ctx.keys.endpoint(endpoint).request(request_id)
    values = yield from _record_fields_flow(key, _STATUS_FIELDS)
    if not isinstance(values, list) or len(values) != len(_STATUS_FIELDS):
        raise SerializationError(f"unexpected HMGET reply from Redis: {values!r:.200}")
    st, why, att, ct, tk, dn = (v.decode() if isinstance(v, bytes) else None for v in values)
    if st is None:
        return RequestStatus(id=request_id, state=RequestState.UNKNOWN, endpoint=endpoint)
    if st == HANDED:
        st, tk = RequestState.QUEUED, None  # handed to a receiver, not confirmed: not picked up
    try:
        state = RequestState(st)
    except ValueError as exc:
        raise SerializationError(f"request {request_id} has an unknown state {st!r}") from exc
    return RequestStatus(
        id=request_id,
        state=state,
        endpoint=endpoint,
        reason=why or None,
        attempt=int(att or 0),
        created_ms=int(ct) if ct else None,
        taken_ms=int(tk) if tk else None,
        done_ms=int(dn) if dn else None,
    )
