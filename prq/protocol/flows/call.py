"""The caller's flow, `call_flow`: enqueue a request, then wait for its outcome — from the
pulse that carries the response, or by reading Redis on the poll grid — withdrawing it at the
pickup deadline and cancelling it at the call deadline (see prq.protocol.flows).

Reading an outcome: a final state becomes a response or its error in prq.protocol.outcomes
(pure, shared with BulkClient); the helpers here open a pulse's response and read a body kept
beside Redis back from the store (an `Offload`).

A record found gone is DataLoss only if it cannot have expired: an answer a caller waits for is
kept at least `waited_response_ttl_s` (apply_response.lua), so a record gone sooner than that
after the last read that found it unanswered was sent was lost. Later (the caller was paused,
or a read took that long to get through), its answer may simply have expired before the caller
read it: RequestExpired, which asks the node for no data-loss check."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from prq.core import bodies
from prq.core.errors import DataLoss, PrqError, QueueUnavailable, SerializationError
from prq.core.lifecycle import RequestState
from prq.core.models import Request, Response, decode_response
from prq.protocol.effects import Exec, Flow, Offload, Waitable, first_reply
from prq.protocol.flows.cancel import cancel_step, withdraw_flow
from prq.protocol.flows.context import Context, exec_calls, to_ms, wait_for
from prq.protocol.flows.registry import locator_calls, registry_calls
from prq.protocol.outcomes import missing_error, open_response, resolve, response_of
from prq.protocol.scripts.enqueue import (
    EnqueueOutcome,
    enqueue_call,
    parse_enqueue,
    parse_stamp,
    stamp_call,
)
from prq.protocol.scripts.redelivery import Redelivery
from prq.protocol.scripts.replies import HANDED, RequestSnapshot
from prq.protocol.scripts.request_state import parse_snapshots, read_response_call

__all__ = ["Stamps", "call_flow"]


def call_flow(
    ctx: Context,
    request: Request,
    body: bytes,
    signal: Waitable,
    pickup_timeout_s: float,
    timeout_s: float | None,
    on_enqueue: Callable[[EnqueueOutcome], None] | None = None,
    on_redelivered: Callable[[str], None] | None = None,
    register: bool = False,
    layout: Flow[None] | None = None,
    stamps: Stamps | None = None,
) -> Flow[Response]:
    """Enqueue `request` and wait for its outcome (see the module docstring).

    `register`: add the endpoint to the registry with the enqueue (the node's first use of it).
    `layout`: a check that runs before anything is written (the node's layout check, which
    raises ConfigurationError for an endpoint holding the previous layout).
    `on_enqueue` is called once the enqueue step answered, with what it did (for the data-loss
    watch: the request's sequence number, none when the id was known already, and the last
    number the endpoint gave before);
    `on_redelivered` gets the request's new state when this call's poll handed it out again
    ("queued") or dead-lettered it ("cancelled") because its receiver went silent
    (at_least_once).
    `stamps`: the node's stamp on the endpoint, which the enqueue carries (a node that knows
    none writes one first): an enqueue sent again that finds it low wrote nothing, since Redis
    lost data after this node's last step there and it may be a replay of one that ran before
    the loss; the call then fails with DataLoss (`on_enqueue` saw the outcome first, and
    declared the loss)."""
    started = ctx.monotonic()
    clock = _CallClock(
        pickup_deadline=started + pickup_timeout_s,
        call_deadline=None if timeout_s is None else started + timeout_s,
        poll_interval_s=ctx.settings.poll_interval_s,
        next_poll=started + ctx.settings.poll_interval_s,
        last_contact=started,
        open_seen=started,
    )
    seen = signal.generation
    if layout is not None:
        yield from layout
    stamp = (0, 0) if stamps is None else (yield from _known_stamp(ctx, request, stamps))
    try:
        return (
            yield from _await_outcome(
                ctx,
                request,
                _enqueue_calls(ctx, request, body, pickup_timeout_s, register, stamp),
                signal,
                seen,
                pickup_timeout_s,
                timeout_s,
                clock,
                on_enqueue,
                on_redelivered,
            )
        )
    except QueueUnavailable as exc:
        raise QueueUnavailable(
            f"{exc} Request {request.id} may have been enqueued and may still run; retrying "
            "with the same request id is safe (it is never enqueued twice).",
            maybe_executed=True,
        ) from exc


class Stamps(Protocol):
    """The node's sender stamp on a call's endpoint, as its enqueue carries it
    (prq.node.data_loss.counters.CallStamps)."""

    def sending(self) -> tuple[int, int]:
        """The generation (its key) and the stamp an enqueue sent now carries (0: none the
        node can rely on; the generation is then a new one, to write it to)."""
        ...

    def learned(self, stamp: int) -> None:
        """The stamp step sent when `sending` was last called wrote `stamp`: the call's
        enqueue carries it."""
        ...


def _known_stamp(ctx: Context, request: Request, stamps: Stamps) -> Flow[tuple[int, int]]:
    """The generation and stamp the enqueue carries: the node's, or, when it knows none it can
    rely on, one written first to a key of a new generation (stamp.lua), so that a replay of
    the enqueue after a loss finds it gone."""
    generation, known = stamps.sending()
    if known:
        return generation, known
    keys = ctx.keys.endpoint(request.endpoint)
    call = stamp_call(keys, ctx.node_id, generation, to_ms(ctx.settings.list_ttl_s))
    stamp = parse_stamp(first_reply((yield exec_calls(call))))
    stamps.learned(stamp)
    # (carried under the key it was written to, though a declaration came meanwhile: an
    # enqueue carrying none could not tell its retry after a loss from a first attempt)
    return generation, stamp


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
    #: When the last read that found the request unanswered (or, first, the enqueue) was sent:
    #: an answer stored since lives at least waited_response_ttl_s from then (call_flow's
    #: module docstring).
    open_seen: float
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


def _enqueue_calls(
    ctx: Context,
    request: Request,
    body: bytes,
    pickup_timeout_s: float,
    register: bool,
    stamp: tuple[int, int] = (0, 0),
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
                               now_ms + to_ms(valid_s))  # fmt: skip
    calls = [
        enqueue_call(
            keys,
            request.id,
            body,
            ctx.node_id,
            now_ms,
            to_ms(pickup_timeout_s),
            to_ms(request_ttl_s),
            to_ms(settings.list_ttl_s),
            to_ms(settings.in_flight_ttl_s()),
            to_ms(settings.receipt_ttl_s(ctx.redis)),
            to_ms(settings.handoff_confirm_s),
            to_ms(settings.receiver_timeout_s),
            request.priority,
            request.producer or ctx.node_id,
            attempts,
            known_stamp=stamp[1],
            stamp_generation=stamp[0],
        )
    ]
    if register:
        calls += registry_calls(ctx.keys, settings, [request.endpoint], now_ms)
    calls += locator_calls(ctx.keys, settings, request.id, request.endpoint, pickup_timeout_s)
    return exec_calls(*calls)


def _enqueued(
    ctx: Context,
    request: Request,
    enqueue: Exec,
    clock: _CallClock,
    on_enqueue: Callable[[EnqueueOutcome], None] | None,
) -> Flow[EnqueueOutcome]:
    """The enqueue step, told to `on_enqueue`; DataLoss when it was sent again and refused."""
    replies = yield enqueue
    outcome = parse_enqueue(first_reply(replies), request.endpoint)
    clock.saw(outcome.handed, ctx.monotonic(), ctx.settings.handoff_confirm_s)
    if on_enqueue is not None:
        on_enqueue(outcome)
    if outcome.refused:
        raise DataLoss(
            f"Redis lost or rolled back its data since this node's last step on endpoint "
            f"{request.endpoint!r}; the enqueue of request {request.id} was sent again after "
            "that and wrote nothing, but its earlier attempt may have queued the request before "
            "the loss, and it may have run. Retry if it is safe (the same request id is "
            "fine).",
            request_id=request.id,
        )
    return outcome


def _await_outcome(
    ctx: Context,
    request: Request,
    enqueue: Exec,
    signal: Waitable,
    seen: int,
    pickup_timeout_s: float,
    timeout_s: float | None,
    clock: _CallClock,
    on_enqueue: Callable[[EnqueueOutcome], None] | None,
    on_redelivered: Callable[[str], None] | None,
) -> Flow[Response]:
    keys = ctx.keys.endpoint(request.endpoint)
    outcome = yield from _enqueued(ctx, request, enqueue, clock, on_enqueue)
    if outcome.known is not None:
        known = yield from _outcome(ctx, outcome.known, request, clock)
        if known is not None:
            return known
        clock.picked_up = outcome.known.state == RequestState.TAKEN

    while True:
        now = ctx.monotonic()
        yield wait_for(signal, seen, clock.wake_at(now) - now)
        if signal.generation != seen:
            seen = signal.generation
            response = yield from _pulse_response(ctx, signal, request)
            if response is not None:
                return response

        judge = clock.picked_up and clock.may_judge(ctx.monotonic())
        read = read_response_call(
            keys,
            (request.id,),
            to_ms(ctx.settings.receiver_timeout_s) if judge else 0,
            Redelivery.of(ctx.settings, ctx.redis),
        )
        sent = ctx.monotonic()
        (snapshot,) = parse_snapshots(first_reply((yield exec_calls(read))), 1)
        clock.saw(snapshot.state == HANDED, ctx.monotonic(), ctx.settings.handoff_confirm_s)
        if snapshot.state in (RequestState.QUEUED, RequestState.TAKEN, HANDED):
            clock.open_seen = sent
        if snapshot.redelivered and on_redelivered is not None:
            on_redelivered(snapshot.state)
        result = yield from _outcome(ctx, snapshot, request, clock)
        if clock.picked_up and snapshot.state in (RequestState.QUEUED, HANDED):
            # handed out again (at_least_once), or given back unrun by a take cut short: it
            # waits for a pickup again, until the deadline its record holds (a redelivery's
            # window afresh; a given-back request's own, or a short grace if that has passed).
            # Whether it may have run is its record's to say when it is withdrawn (withdraw.lua)
            clock.picked_up, clock.redelivered = False, True
            left_s = (
                pickup_timeout_s
                if snapshot.pickup_left_ms is None
                else max(0.0, snapshot.pickup_left_ms / 1000)
            )
            clock.pickup_deadline = ctx.monotonic() + left_s
        if result is None:
            clock.picked_up = clock.picked_up or snapshot.state == RequestState.TAKEN
            result = yield from _past_deadlines(ctx, request, clock, timeout_s)
        if result is not None:
            return result


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


def _outcome(
    ctx: Context, snapshot: RequestSnapshot, request: Request, clock: _CallClock
) -> Flow[Response | None]:
    """resolve(), reading a response kept beside Redis back from the store; a record gone is
    DataLoss or RequestExpired by how long ago the caller saw it unanswered (see the module
    docstring)."""
    if snapshot.state == "missing":
        unseen_s = ctx.monotonic() - clock.open_seen
        raise missing_error(
            request.id, request.endpoint, unseen_s, ctx.settings.waited_response_ttl_s()
        )
    if snapshot.state != RequestState.DONE:
        return resolve(snapshot, request.id, request.endpoint, ctx.signer)
    data = open_response(ctx.signer, request.id, request.endpoint, snapshot.response)
    return (yield from _read_response(ctx, request, data))


def _past_deadlines(
    ctx: Context, request: Request, clock: _CallClock, timeout_s: float | None
) -> Flow[Response | None]:
    """Act on a passed pickup or call deadline: withdraw, or raise CallTimeout."""
    now = ctx.monotonic()
    if not clock.picked_up and now >= clock.pickup_deadline:
        why = "redelivery_timeout" if clock.redelivered else "pickup_timeout"
        snapshot = yield from withdraw_flow(ctx, request, why)
        result = yield from _outcome(ctx, snapshot, request, clock)
        if result is not None:
            return result
        clock.picked_up = True  # taken just before the deadline: it keeps waiting
    if clock.call_deadline is not None and now >= clock.call_deadline:
        snapshot, _mine = yield from cancel_step(ctx, request.endpoint, request.id, "call_timeout")
        return (yield from _outcome(ctx, snapshot, request, clock))  # raises unless answered
    return None
