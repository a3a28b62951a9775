"""Per-endpoint capacity limits, kept in Redis so every node applies the same ones.

- `max_in_flight`: at most this many requests of the endpoint are picked up and unanswered at
  once, across all receivers (take.lua and enqueue.lua's hand-off check it). A request counts
  while its in-flight entry was refreshed within the receiver timeout (by its take or its
  receiver's heartbeats), so the slot of a receiver that died frees by itself.
- `max_pending`: an enqueue beyond this many queued requests raises `QueueFull` (retryable)
  and writes nothing; a bulk batch writes what fits and raises `prq.bulk.BatchRefused`.

Limits live in the hash `prq:{<e>}:lim` (fields `mif`, `mp`), configuration without a TTL;
setting both to None deletes it. Redis losing its data loses the limits too: whoever sets them
(a deploy script calling `set_limits`) sets them again after a restart.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from prq.core.errors import InvalidSettings, SerializationError, typed_validation
from prq.core.names import validate_endpoint
from prq.protocol.effects import Call, Exec, Flow, Reply
from prq.protocol.flows.context import Context

__all__ = ["MAX_LIMIT", "EndpointLimits", "limits_flow", "set_limits_flow"]

#: Largest limit accepted (a JSON number stays exact up to here).
MAX_LIMIT = 2**53
_Limit = Annotated[int, Field(ge=1, le=MAX_LIMIT)]


class EndpointLimits(BaseModel):
    """An endpoint's capacity limits; None means no limit."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    endpoint: str
    max_in_flight: _Limit | None = None
    max_pending: _Limit | None = None


def _limit(value: Reply, field: str) -> int | None:
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else str(value)
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise SerializationError(f"stored limit {field}={text!r:.50} is not a positive integer")
    return int(text)


def limits_flow(ctx: Context, endpoint: str) -> Flow[EndpointLimits]:
    """The endpoint's limits as Redis holds them now."""
    key = ctx.keys.endpoint(validate_endpoint(endpoint)).limits
    replies = yield Exec((Call(("HMGET", key, "mif", "mp")),))
    assert isinstance(replies, list)
    values = replies[0]
    if not isinstance(values, list) or len(values) != 2:
        raise SerializationError(f"unexpected HMGET reply from Redis: {values!r:.200}")
    return EndpointLimits(
        endpoint=endpoint,
        max_in_flight=_limit(values[0], "max_in_flight"),
        max_pending=_limit(values[1], "max_pending"),
    )


def set_limits_flow(
    ctx: Context,
    endpoint: str,
    *,
    max_in_flight: int | None = None,
    max_pending: int | None = None,
) -> Flow[EndpointLimits]:
    """Replace the endpoint's limits (None: no limit) and return what Redis holds after.
    Invalid values raise before anything is written (InvalidSettings, InvalidEndpoint)."""
    endpoint = validate_endpoint(endpoint)
    with typed_validation(InvalidSettings, "limits"):
        wanted = EndpointLimits(
            endpoint=endpoint, max_in_flight=max_in_flight, max_pending=max_pending
        )
    key = ctx.keys.endpoint(endpoint).limits
    present: list[str | int] = []
    absent: list[str] = []
    for field, value in (("mif", wanted.max_in_flight), ("mp", wanted.max_pending)):
        if value is None:
            absent.append(field)
        else:
            present += [field, value]
    calls = []
    if present:
        calls.append(Call(("HSET", key, *present)))
    if absent:
        calls.append(Call(("HDEL", key, *absent)))
    yield Exec(tuple(calls))
    return (yield from limits_flow(ctx, endpoint))
