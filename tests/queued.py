"""What an endpoint has queued, read straight from Redis (independently of prq.protocol.levels), and
a take by a receiver that then dies (`silent_take`).

Queued ids live in lanes per priority level (prq/protocol/scripts/_queue.lua): a front lane taken
first, and one list per producer, the lanes set scoring each producer by its first id's virtual time
(index i: that time + i). Levels are listed in `prq:{e}:pri`, each level's depth is its clock's
`n`. Take order: highest level first, then the front lane, then by virtual time (ties in member
order). Ids withdrawn or cancelled while queued stay in their lane until a take skips them: the
readers here leave them out (the level's removed set names them).
"""

from __future__ import annotations

import uuid
from typing import Any

import redis

from prq import QueueSettings
from prq.core.keys import EndpointKeys, KeySchema
from prq.protocol.scripts.loading import TAKE
from prq.protocol.scripts.redelivery import Redelivery
from prq.protocol.scripts.take import TakenItem, parse_take, take_call


def queued_ids(client: redis.Redis, keys: EndpointKeys) -> list[bytes]:
    """Every queued id, highest priority first, then in the order the level hands them out."""
    ids: list[bytes] = []
    for level in _levels(client, keys, "REV"):
        ids += _level_order(client, keys, level)
    return ids


def level_ids(client: redis.Redis, keys: EndpointKeys, priority: int) -> list[str]:
    """The ids queued at one priority, in the order that level hands them out."""
    return [i.decode() for i in _level_order(client, keys, str(priority))]


def queue_depth(client: redis.Redis, keys: EndpointKeys) -> int:
    """How many ids are queued over all priority levels (the levels' depth counters)."""
    return sum(int(_send(client, "HGET", keys.level(p), "n") or 0) for p in _levels(client, keys))


def _level_order(client: redis.Redis, keys: EndpointKeys, priority: str) -> list[bytes]:
    """A level's ids in take order, read in full, removed ones left out."""
    removed = set(_send(client, "SMEMBERS", keys.level_removed(priority)))
    lanes: list[tuple[bytes, float]] = client.zrange(  # type: ignore[assignment]
        keys.level_lanes(priority), 0, -1, withscores=True
    )
    entries: list[tuple[int, float, bytes, bytes]] = []
    for member, score in lanes:
        ids = _send(client, "LRANGE", keys.level_lane(priority, member.decode()), 0, -1)
        for i, request_id in enumerate(ids):
            if member == b"f":
                entries.append((0, i, b"", request_id))
            else:
                entries.append((1, float(score) + i, member, request_id))
    entries.sort(key=lambda e: e[:3])
    return [e[3] for e in entries if e[3] not in removed]


def _levels(client: redis.Redis, keys: EndpointKeys, *order: str) -> list[str]:
    return [p.decode() for p in _send(client, "ZRANGE", keys.levels, 0, -1, *order)]


def _send(client: redis.Redis, *args: str | int | bytes) -> Any:
    """A raw command (redis-py leaves execute_command untyped)."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def silent_take(client: redis.Redis, prefix: str, endpoint: str, want: int = 10) -> list[TakenItem]:
    """Take up to `want` of what is queued as a receiver that then never beats nor answers (a
    dead one)."""
    return take_as(client, prefix, endpoint, f"silent-{uuid.uuid4().hex}", want=want)


def take_as(
    client: redis.Redis, prefix: str, endpoint: str, token: str, *, want: int = 10, park_ms: int = 0
) -> list[TakenItem]:
    """One take.lua call with `token` (default settings, node "silent-node"), asking to park
    for `park_ms` should it find nothing; what it handed out."""
    client.script_load(TAKE.source)
    keys = KeySchema(prefix).endpoint(endpoint)
    settings = QueueSettings()
    call = take_call(
        keys, token, "silent-node", 2000, want, max(100, want),
        int(settings.in_flight_ttl_s() * 1000), int(settings.receipt_ttl_s() * 1000), park_ms,
        86_400_000, int(settings.receiver_timeout_s * 1000), Redelivery.of(settings),
    )  # fmt: skip
    return parse_take(_send(client, *call.args)).items
