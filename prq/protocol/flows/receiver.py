"""The receiver's flows: `take_flow` (take requests, parking for a hand-off between takes) and
`respond_flow` (store an answer as the request's owner)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prq.protocol.effects import Exec, Flow, Waitable, first_reply
from prq.protocol.flows.context import Context, exec_calls, to_ms, wait_for
from prq.protocol.scripts.answer import apply_response_call, parse_apply_response
from prq.protocol.scripts.redelivery import Redelivery
from prq.protocol.scripts.take import TakenItem, parse_take, take_call

__all__ = ["DEFAULT_STOP_CHECK_S", "DEFAULT_TAKE_SCAN", "TakeResult", "respond_flow", "take_flow"]


#: How many ids one take may pop while skipping dead ones.
DEFAULT_TAKE_SCAN = 100
#: How often a waiting take checks whether its server loop was asked to stop.
DEFAULT_STOP_CHECK_S = 0.25


@dataclass(frozen=True, slots=True)
class TakeResult:
    """What one take handed out, under which owner token."""

    token: str
    items: list[TakenItem]
    #: The endpoint's last sequence number as the last take saw it (0: none).
    counter: int | None = None
    #: at_least_once requests of silent receivers the takes queued again or dead-lettered.
    redelivered: int = 0
    #: The receiver's stamp after the last take (take.lua; 0: not known).
    stamp: int = 0
    #: What the stamp held when the last take found it below the stamp it was sent with (0:
    #: gone; None: it was not): Redis went back, and that take took nothing.
    went_back: int | None = None
    #: The stamp the last take was sent with (what `went_back` is below: a server time before
    #: the loss, its fence).
    sent_stamp: int = 0


def take_flow(
    ctx: Context,
    endpoint: str,
    token: str,
    signal: Waitable,
    max_items: int,
    timeout_s: float,
    should_stop: Callable[[], bool] | None = None,
    before_take: Callable[[], int] | None = None,
    on_stamp: Callable[[int], None] | None = None,
) -> Flow[TakeResult]:
    """Take up to `max_items` requests, waiting up to `timeout_s` for the first.

    When there is nothing to take, the take parks the token: a request enqueued meanwhile is
    handed to it, and its node pulsed. The next take collects the hand-off from the token's
    receipt, which confirms it (scripts/_handoff.lua): a request is never run on the strength
    of a pulse alone, so one handed to a receiver that died while parked goes to another
    receiver instead of being lost with it. Between takes nothing is sent to Redis until a
    pulse or a hand-off arrives or the poll interval passes; `should_stop` is checked at least
    every `DEFAULT_STOP_CHECK_S`. The last take (at the deadline, or on stop) does not park, and
    returns whatever the token was handed. `before_take` is called as each take is sent (the
    result is the last one's: what it read is judged against what the node knew then); it
    returns the highest stamp the receiver was answered on the endpoint (0: none), and a take
    that finds its stamp below that (Redis went back) returns at once, having taken nothing.
    `on_stamp` is told the stamp of each take that found none below: the node's other takes,
    sent while this flow waits on, carry it (a rollback behind this take shows in theirs).
    """
    settings = ctx.settings
    keys = ctx.keys.endpoint(endpoint)
    deadline = ctx.monotonic() + timeout_s
    final = timeout_s <= 0
    redelivered = 0
    stamp = 0
    redelivery = Redelivery.of(settings, ctx.redis)
    while True:
        seen = signal.generation
        now = ctx.monotonic()
        park_s = 0.0 if final else min(settings.poll_interval_s, deadline - now)
        # (the flow's own last stamp counts too: an earlier take of it parked and came back)
        known_stamp = max(stamp, 0 if before_take is None else before_take())
        replies = yield Exec(
            (take_call(
                keys,
                token,
                ctx.node_id,
                to_ms(settings.handoff_confirm_s),
                max_items,
                DEFAULT_TAKE_SCAN,
                to_ms(settings.in_flight_ttl_s()),
                to_ms(settings.receipt_ttl_s(ctx.redis)),
                to_ms(park_s) if park_s > 0 else 0,
                to_ms(settings.list_ttl_s),
                to_ms(settings.receiver_timeout_s),
                redelivery,
                known_stamp,
            ),),
            express=final,  # (a take ahead, or the last one: not worth waiting for answers)
        )  # fmt: skip
        taken = parse_take(first_reply(replies))
        redelivered += taken.redelivered
        stamp = taken.stamp
        if on_stamp is not None and taken.went_back is None:
            on_stamp(stamp)
        if taken.limited:
            ctx.unlimited.discard(endpoint)
        elif taken.limited is not None:
            ctx.unlimited.add(endpoint)
        if taken.items or final or taken.went_back is not None:
            return TakeResult(
                token,
                taken.items,
                taken.counter,
                redelivered,
                taken.stamp,
                taken.went_back,
                known_stamp,
            )
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
            yield wait_for(signal, seen, timeout)


def respond_flow(
    ctx: Context,
    endpoint: str,
    request_id: str,
    owner_token: str,
    response: bytes,
    ttl_s: float | None = None,
) -> Flow[str]:
    """Store a response as the request's owner, kept `ttl_s` (None: the response TTL), or
    longer when a caller waits for it (QueueSettings.waited_response_ttl_s); signed, with a
    signing key, to expire when the longer of the two ends; returns the script's outcome."""
    keep_ms = to_ms(ctx.settings.response_ttl_s if ttl_s is None else ttl_s)
    waited_ms = to_ms(ctx.settings.waited_response_ttl_s())
    if ctx.signer is not None:
        expiry_ms = ctx.wall_ms() + max(keep_ms, waited_ms)
        response = ctx.signer.sign("response", request_id, endpoint, response, expiry_ms)
    replies = yield exec_calls(
        apply_response_call(
            ctx.keys.endpoint(endpoint),
            request_id,
            owner_token,
            response,
            keep_ms,
            ctx.wall_ms(),
            ctx.settings.pulse_inline_limit_bytes,
            unlimited=endpoint in ctx.unlimited,
            waited_ttl_ms=waited_ms,
        )
    )
    return parse_apply_response(first_reply(replies))
