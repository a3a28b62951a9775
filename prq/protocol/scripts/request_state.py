"""The sender's steps on a request it sent: `read_response` (where one or many requests stand,
taking back an overdue hand-off and handing out again the requests of silent receivers;
read_response.lua), `withdraw` (before pickup) and `cancel` (before or after pickup), with
the parsers of the snapshots they answer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Final

from prq.core.errors import SerializationError
from prq.core.keys import EndpointKeys
from prq.protocol.effects import Call, Reply
from prq.protocol.scripts.loading import CANCEL, READ_RESPONSE, WITHDRAW
from prq.protocol.scripts.redelivery import Redelivery
from prq.protocol.scripts.replies import RequestSnapshot, as_array, snapshot_of

__all__ = [
    "MAX_READ_IDS",
    "cancel_call",
    "parse_snapshot",
    "parse_snapshots",
    "parse_withdraw",
    "read_response_call",
    "withdraw_call",
]


#: Most request ids one read_response call reads (bounds the time Redis spends in one script).
MAX_READ_IDS: Final = 256


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
    items = as_array(reply, "withdraw")
    if len(items) != 4 or not isinstance(items[3], int):
        raise SerializationError(f"unexpected withdraw reply from Redis: {reply!r:.200}")
    return snapshot_of(items[:3]), items[3] == 1


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


def parse_snapshot(reply: Reply) -> RequestSnapshot:
    """Parse the {state, response, reason, pickup left, redelivered} reply of read_response;
    state "handed" is a hand-off waiting for its receiver's confirmation (not picked up)."""
    items = as_array(reply, "request state")
    if len(items) != 5:
        raise SerializationError(f"unexpected request state reply from Redis: {reply!r:.200}")
    snapshot = replace(snapshot_of(items[:3]), redelivered=items[4] == 1)
    left = items[3]
    if not isinstance(left, int):
        return snapshot
    return replace(snapshot, pickup_left_ms=left)


def parse_snapshots(reply: Reply, count: int) -> list[RequestSnapshot]:
    """Parse read_response's reply for `count` ids: one snapshot each, in order."""
    items = as_array(reply, "request states")
    if len(items) != count:
        raise SerializationError(
            f"read_response answered {len(items)} states for {count} ids: {reply!r:.200}"
        )
    return [parse_snapshot(item) for item in items]
