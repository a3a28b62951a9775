"""What several scripts answer alike: raw reply values read as text or as an array, and a
request's state as a script saw it (`RequestSnapshot`: enqueue of a known id, withdraw,
cancel and read_response answer one). `HANDED` is the state of a hand-off not yet confirmed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from prq.core.errors import SerializationError
from prq.protocol.effects import Reply

__all__ = ["HANDED", "RequestSnapshot", "as_array", "as_text", "snapshot_of"]

#: The state of a request handed to a parked receiver that has not confirmed it yet
#: (_handoff.lua): not picked up. Scripts that report a state to users read it as "queued".
HANDED: Final = "handed"


def as_text(value: Reply) -> str:
    """A reply value as text (invalid UTF-8 replaced; None is empty)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return str(value)


def as_array(reply: Reply, what: str) -> list[Reply]:
    """An array reply of the `what` script; anything else is a SerializationError."""
    if not isinstance(reply, list):
        raise SerializationError(f"unexpected {what} reply from Redis: {reply!r:.200}")
    return reply


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


def snapshot_of(items: list[Reply]) -> RequestSnapshot:
    """The snapshot in a reply's {state, response, reason} values."""
    raw = items[1]
    return RequestSnapshot(
        state=as_text(items[0]),
        response=raw if isinstance(raw, bytes) else as_text(raw).encode(),
        reason=as_text(items[2]),
    )
