"""What an endpoint has queued, read straight from Redis (independently of prq.levels), and a
take by a receiver that then dies (`silent_take`).

Queued ids live in one sorted set per priority level (`prq:{e}:q:<p>`), listed in `prq:{e}:lv`;
see prq/scripts/_queue.lua. Take order: highest level first, then by score within a level.
"""

from __future__ import annotations

import uuid
from typing import Any

import redis

from prq import QueueSettings
from prq.keys import EndpointKeys, KeySchema
from prq.scripts import TAKE, Redelivery, TakenItem, parse_take, take_call


def queued_ids(client: redis.Redis, keys: EndpointKeys) -> list[bytes]:
    """Every queued id, highest priority first, then in the order the level hands them out."""
    ids: list[bytes] = []
    for level in _levels(client, keys, "REV"):
        ids += _send(client, "ZRANGE", keys.level(level), 0, -1)
    return ids


def level_ids(client: redis.Redis, keys: EndpointKeys, priority: int) -> list[str]:
    """The ids queued at one priority, in the order that level hands them out."""
    return [i.decode() for i in _send(client, "ZRANGE", keys.level(priority), 0, -1)]


def queue_depth(client: redis.Redis, keys: EndpointKeys) -> int:
    """How many ids are queued over all priority levels."""
    return sum(int(_send(client, "ZCARD", keys.level(p))) for p in _levels(client, keys))


def _levels(client: redis.Redis, keys: EndpointKeys, *order: str) -> list[str]:
    return [p.decode() for p in _send(client, "ZRANGE", keys.levels, 0, -1, *order)]


def _send(client: redis.Redis, *args: str | int | bytes) -> Any:
    """A raw command (redis-py leaves execute_command untyped)."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def silent_take(client: redis.Redis, prefix: str, endpoint: str) -> list[TakenItem]:
    """Take what is queued as a receiver that then never beats nor answers (a dead one)."""
    client.script_load(TAKE.source)
    keys = KeySchema(prefix).endpoint(endpoint)
    settings = QueueSettings()
    call = take_call(
        keys, f"silent-{uuid.uuid4().hex}", "silent-node", 2000, 10, 100,
        int(settings.in_flight_ttl_s() * 1000), 60_000, 0, 86_400_000,
        int(settings.receiver_timeout_s * 1000),
        Redelivery.of(settings, KeySchema(prefix).node_channel_prefix),
    )  # fmt: skip
    return parse_take(_send(client, *call.args)).items
