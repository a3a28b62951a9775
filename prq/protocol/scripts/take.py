"""A receiver's hold on requests: `take` (hand out queued requests, or park for a hand-off;
take.lua), `hand_back` (give a held request back on shutdown) and `unpark` (withdraw the park of
a take that will never return), each a call builder and, where it answers more than a state, a
reply parser."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from prq.core.errors import SerializationError
from prq.core.keys import EndpointKeys
from prq.protocol.effects import Call, Reply
from prq.protocol.scripts.loading import HAND_BACK, TAKE, UNPARK
from prq.protocol.scripts.redelivery import Redelivery
from prq.protocol.scripts.replies import as_array, as_text

__all__ = [
    "TakeReply",
    "TakenItem",
    "hand_back_call",
    "parse_take",
    "parse_unpark",
    "take_call",
    "unpark_call",
]


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
    """What one take did: ids skipped, the endpoint's last sequence number, at_least_once requests
    of silent receivers it queued again or dead-lettered, and the requests handed out."""

    skipped: int
    counter: int
    redelivered: int
    items: list[TakenItem]
    #: Whether the endpoint has a max_in_flight limit (None: this take did not look).
    limited: bool | None = None
    #: The receiver's stamp after this take (take.lua), 0 when not known.
    stamp: int = 0
    #: What the stamp held when that was below the one the take was sent with (0: gone; None:
    #: it was not): Redis went back, and the take took nothing.
    went_back: int | None = None


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
    known_stamp: int = 0,
) -> Call:
    """A take (take.lua); `known_stamp`: the highest stamp `receiver` was answered on the
    endpoint, 0 when it knows none it can rely on (a stamp below it says Redis went back)."""
    return TAKE.call(
        (keys.levels, keys.request_prefix, keys.take_receipt(owner_token), keys.parked,
         keys.parks, keys.numbers, keys.running, keys.limits, keys.level_prefix, keys.lease,
         *keys.dead, keys.handoffs, keys.stamp(receiver)),
        (owner_token, receiver, handoff_confirm_ms, max_items, max_scan, in_flight_ttl_ms,
         receipt_ttl_ms, park_ms, park_ttl_ms, receiver_timeout_ms, redelivery.request_ttl_extra_ms,
         redelivery.dead_letter_ttl_ms, redelivery.dead_letter_max, keys.pulse_channel,
         keys.node_channel_prefix, known_stamp),
    )  # fmt: skip


#: Values before the first item of a take reply: skipped, counter, redelivered, limited,
#: stamp, went back.
_TAKE_HEAD: Final = 6


def parse_take(reply: Reply) -> TakeReply:
    items = as_array(reply, "take")
    head = _TAKE_HEAD
    if len(items) < head or not all(isinstance(v, int) for v in items[:head]):
        raise SerializationError(f"unexpected take reply from Redis: {reply!r:.200}")
    if (len(items) - head) % 5:
        raise SerializationError(f"unexpected take reply from Redis: {reply!r:.200}")
    taken = []
    for i in range(head, len(items), 5):
        body = items[i + 1]
        created, sequence = as_text(items[i + 3]), as_text(items[i + 4])
        taken.append(
            TakenItem(
                request_id=as_text(items[i]),
                body=body if isinstance(body, bytes) else as_text(body).encode(),
                attempt=int(as_text(items[i + 2]) or 1),
                created_ms=int(created) if created.isdigit() else 0,
                sequence=int(sequence) if sequence.isdigit() else 0,
            )
        )
    skipped, counter, redelivered, limited, stamp, back = items[:head]
    assert isinstance(skipped, int) and isinstance(counter, int)
    assert isinstance(redelivered, int) and isinstance(limited, int)
    assert isinstance(stamp, int) and isinstance(back, int)
    return TakeReply(
        skipped,
        counter,
        redelivered,
        taken,
        None if limited < 0 else limited > 0,
        stamp,
        None if back < 0 else back,
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
