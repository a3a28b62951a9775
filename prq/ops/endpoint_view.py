"""The Inspector's view of endpoints: the registry of endpoints nodes reported, each one's
figures (depth per priority level, in flight, oldest age, receivers, enqueue counter, limits,
dead letters), read side by side in a few pipelined round trips, and its capacity limits.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from prq.core.keys import decode_endpoint, encode_endpoint
from prq.core.names import readable_endpoint
from prq.core.records import QUEUED_HEAD_BYTES, queued_head
from prq.ops.answers import EndpointInfo, PriorityDepth
from prq.ops.reading import (
    InspectorBase,
    _raise_unless_wrongtype,
    _reading,
    _server_ms,
    _text,
)
from prq.protocol.effects import Call, Exec, Flow
from prq.protocol.levels import levels_call, levels_from
from prq.protocol.limits import MAX_LIMIT, EndpointLimits
from prq.protocol.presence import RECEIVER_LIVE_REPORTS, presence_interval_s

__all__ = ["OLDEST_PROBE", "SHOWN_LEVELS", "EndpointView"]

logger = logging.getLogger(__name__)

#: How many of a level's first ids are looked at to find the oldest live request.
OLDEST_PROBE = 10
#: Most priority levels an endpoint's listing shows, highest first (its depth counts them all).
SHOWN_LEVELS = 32


class EndpointView(InspectorBase):
    """The Inspector's reads of endpoints (see prq.ops.inspector for where each figure comes
    from)."""

    async def endpoints(self) -> list[EndpointInfo]:
        """Every endpoint nodes reported lately (at most `max_endpoints`, newest first kept),
        sorted by name."""
        now_ms, seen = await self._registry()
        infos = await self._describe(sorted(seen), now_ms)
        return [info.model_copy(update={"last_seen_ms": seen[info.endpoint]}) for info in infos]

    async def enqueued_totals(self) -> dict[str, int]:
        """Every reported endpoint's enqueue counter: two round trips, one read per endpoint
        (what a throughput sampler needs, without the rest of `endpoints()`)."""
        _, seen = await self._registry()
        names = sorted(seen)
        if not names:
            return {}
        with _reading():
            pipe = self.client.pipeline(transaction=False)
            for endpoint in names:
                pipe.get(self.keys.endpoint(endpoint).sequence)
            counters = await pipe.execute()
        return {name: int(value or 0) for name, value in zip(names, counters, strict=True)}

    async def _registry(self) -> tuple[int, dict[str, int]]:
        """Redis's time (ms) and the endpoints nodes reported: name -> last seen (ms)."""
        with _reading():
            pipe = self.client.pipeline(transaction=False)
            pipe.execute_command("TIME")
            pipe.execute_command(
                "ZRANGE", self.keys.endpoints, 0, self.max_endpoints - 1, "REV", "WITHSCORES"
            )
            now_reply, registry = await pipe.execute()
        seen: dict[str, int] = {}
        for encoded, score in _pairs(registry):
            try:
                endpoint = readable_endpoint(decode_endpoint(_text(encoded)))
            except (ValueError, UnicodeDecodeError):
                continue  # not written by prq: never shown, never used in a key
            if encode_endpoint(endpoint) != _text(encoded):
                continue  # not prq's encoding of any name (e.g. a stray "%ZZ")
            seen[endpoint] = int(float(score))
        return _server_ms(now_reply), seen

    async def endpoint(self, endpoint: str) -> EndpointInfo:
        """One endpoint, registered or not (raises InvalidEndpoint for a bad name)."""
        endpoint = readable_endpoint(endpoint)
        with _reading():
            pipe = self.client.pipeline(transaction=False)
            pipe.execute_command("TIME")
            pipe.execute_command("ZSCORE", self.keys.endpoints, encode_endpoint(endpoint))
            now_reply, score = await pipe.execute()
        (info,) = await self._describe([endpoint], _server_ms(now_reply))
        return info.model_copy(update={"last_seen_ms": int(float(score or 0))})

    async def _describe(self, endpoints: Sequence[str], now_ms: int) -> list[EndpointInfo]:
        """Every endpoint's figures, the endpoints read side by side: one round trip, plus two
        when something is queued (the levels' sizes and heads, then the heads' states)."""
        return await self._read_flows([self._describe_flow(e, now_ms) for e in endpoints])

    def _describe_flow(self, endpoint: str, now_ms: int) -> Flow[EndpointInfo]:
        keys = self.keys.endpoint(endpoint)
        in_flight_from = now_ms - int(self.settings.in_flight_ttl_s() * 1000)
        live_from = now_ms - int(RECEIVER_LIVE_REPORTS * presence_interval_s(self.settings) * 1000)
        replies = yield Exec(
            (
                Call(("ZCOUNT", keys.running, in_flight_from, "+inf")),
                Call(("ZCOUNT", keys.receivers, live_from, "+inf")),
                Call(("GET", keys.sequence)),
                Call(("HMGET", keys.limits, "mif", "mp")),
                Call(("ZCARD", keys.dead[0])),
                levels_call(keys),
            )
        )
        assert isinstance(replies, list)
        in_flight, receivers, counter, limits, dead, found = replies
        levels = yield from levels_from(keys, found, head=OLDEST_PROBE)
        head = [request_id for level in levels[:SHOWN_LEVELS] for request_id in level.head]
        created_ms = []
        if head:
            # each record read both ways in one round trip: the call of the other form answers
            # WRONGTYPE (a request queued by BulkClient is a string until picked up:
            # prq.core.records)
            calls = [
                call
                for i in head
                for call in (
                    Call(("HMGET", keys.request(i), "st", "ct")),
                    Call(("GETRANGE", keys.request(i), 0, QUEUED_HEAD_BYTES - 1)),
                )
            ]
            replies = yield Exec(tuple(calls))
            assert isinstance(replies, list)
            for hashed, strung in zip(replies[::2], replies[1::2], strict=True):
                st, created = _either_form(hashed, strung, ("st", "ct"))
                if _text(st) == "queued" and _text(created).isdigit():
                    created_ms.append(int(_text(created)))
        oldest = min(created_ms, default=None)
        max_in_flight, max_pending = limits
        return EndpointInfo(
            endpoint=endpoint,
            depth=sum(level.depth for level in levels),
            in_flight=int(in_flight),
            oldest_age_s=None if oldest is None else max(0.0, (now_ms - oldest) / 1000),
            receivers=int(receivers),
            enqueued_total=int(counter or 0),
            last_seen_ms=0,
            max_in_flight=_stored_limit(endpoint, "max_in_flight", max_in_flight),
            max_pending=_stored_limit(endpoint, "max_pending", max_pending),
            dead_letters=int(dead or 0),
            priorities=[
                PriorityDepth(priority=level.priority, depth=level.depth)
                for level in levels[:SHOWN_LEVELS]
            ],
        )

    async def limits(self, endpoint: str) -> EndpointLimits:
        """The endpoint's capacity limits (raises InvalidEndpoint for a bad name); a malformed
        stored value shows as None, with a warning, as in `endpoints()`."""
        endpoint = readable_endpoint(endpoint)
        with _reading():
            max_in_flight, max_pending = await self.client.hmget(
                self.keys.endpoint(endpoint).limits, ["mif", "mp"]
            )
        return EndpointLimits(
            endpoint=endpoint,
            max_in_flight=_stored_limit(endpoint, "max_in_flight", max_in_flight),
            max_pending=_stored_limit(endpoint, "max_pending", max_pending),
        )


def _stored_limit(endpoint: str, field: str, value: Any) -> int | None:
    """A limit as the limits hash stores it: None when unset, and None (with a warning) when
    it is not an integer within 1..MAX_LIMIT: prq never writes such a value, and the scripts
    apply no limit for it either (their `limit` guard), but an operator should look at it."""
    if value is None:
        return None
    text = _text(value)
    if text.isascii() and text.isdigit() and 1 <= int(text) <= MAX_LIMIT:
        return int(text)
    logger.warning(
        "malformed stored limit endpoint=%r field=%s value=%r (shown as no limit)",
        endpoint,
        field,
        text[:50],
    )
    return None


def _pairs(reply: Any) -> list[tuple[Any, Any]]:
    """(member, score) pairs of a WITHSCORES reply: pairs in RESP3, a flat list in RESP2."""
    items = list(reply or [])
    if items and isinstance(items[0], (list, tuple)):
        return [(member, score) for member, score in items]
    return list(zip(items[::2], items[1::2], strict=False))


def _either_form(hashed: Any, strung: Any, names: Sequence[str]) -> list[Any]:
    """The fields `names` of a record read both ways (HMGET of them, and GETRANGE of its head):
    the hash's, or the queued-form string's (prq.core.records), or all None for no record."""
    if isinstance(hashed, list):
        return hashed
    if isinstance(strung, bytes):
        fields = queued_head(strung) or {"st": b"queued"}  # damaged: still queued
        return [fields.get(name) for name in names]
    _raise_unless_wrongtype(hashed, strung)
    return [None] * len(names)
