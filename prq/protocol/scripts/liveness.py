"""The steps that tell who is alive: `beat` (a call's heartbeat, from its sender or its
receiver; beat.lua), `presence` (a receiver node listed on an endpoint) and `canary` (the key
whose loss tells that Redis lost data), each a call builder and, where it answers, a parser."""

from __future__ import annotations

import secrets

from prq.core.errors import SerializationError
from prq.core.keys import EndpointKeys
from prq.protocol.effects import Call, Reply
from prq.protocol.scripts.loading import BEAT, CANARY, PRESENCE
from prq.protocol.scripts.replies import as_array, as_text

__all__ = [
    "beat_call",
    "canary_call",
    "fresh_canary",
    "parse_beat",
    "parse_canary",
    "presence_call",
]


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
    items = as_array(reply, "beat")
    if len(items) != 3:
        raise SerializationError(f"unexpected beat reply from Redis: {reply!r:.200}")
    done, _, total = as_text(items[2]).partition("/")
    progress = (int(done), int(total)) if done.isdigit() and total.isdigit() else None
    return as_text(items[0]), as_text(items[1]), progress


def presence_call(keys: EndpointKeys, node_id: str, stale_ms: int, ttl_ms: int) -> Call:
    return PRESENCE.call((keys.receivers,), (node_id, stale_ms, ttl_ms))


def canary_call(key: str, ttl_ms: int, expected: int | None, following: int) -> Call:
    """Step the canary `key` from `expected` (0: none; None: not known, write anyway) to
    `following`: the reply is `following` when the canary held what was expected."""
    return CANARY.call((key,), (ttl_ms, -1 if expected is None else expected, following))


def fresh_canary() -> int:
    """A fresh canary's value: at random, so that no canary Redis brings back from an older
    state of its data has it (and, below 2**53, exact in Lua)."""
    return secrets.randbelow(2**52) + 2**40


def parse_canary(reply: Reply) -> tuple[int, int]:
    """The canary's value after the step, and the server's clock then (microseconds)."""
    if (
        not isinstance(reply, list)
        or len(reply) != 2
        or not all(isinstance(part, int) for part in reply)
    ):
        raise SerializationError(f"unexpected canary reply from Redis: {reply!r:.200}")
    value, clock = reply
    assert isinstance(value, int) and isinstance(clock, int)
    return value, clock
