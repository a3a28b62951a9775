"""What the Inspector (prq.ops.inspector) answers: endpoints, queued requests and Redis's
health and memory, as pydantic models the CLI, the admin service and the exporter
(prq.ops.exporter) read. Plain data: nothing here reads Redis.
"""

from __future__ import annotations

from pydantic import BaseModel

__all__ = [
    "EndpointInfo",
    "PriorityDepth",
    "QueuedItem",
    "QueuedPage",
    "RedisHealth",
    "RedisMemory",
]


class PriorityDepth(BaseModel):
    """How many requests wait at one priority."""

    priority: int
    depth: int


class EndpointInfo(BaseModel):
    """One endpoint, as Redis sees it now."""

    endpoint: str
    #: Requests waiting for pickup.
    depth: int
    #: Requests picked up and not answered yet.
    in_flight: int
    #: Age of the oldest queued request, seconds (None when nothing is queued).
    oldest_age_s: float | None
    #: Receiver nodes that took from the endpoint within the last few checks.
    receivers: int
    #: The endpoint's enqueue counter: requests enqueued since Redis last lost its data (a bulk
    #: batch sent whole counts each of its places, queued or not: scripts/enqueue_many.lua).
    enqueued_total: int
    #: When a node last reported using the endpoint, ms since the epoch (0: never).
    last_seen_ms: int
    #: Most requests picked up and unanswered at once across all receivers (None: no limit).
    max_in_flight: int | None = None
    #: Most requests queued at once; enqueues beyond it raise QueueFull (None: no limit).
    max_pending: int | None = None
    #: Dead letters kept for the endpoint (see prq.protocol.dead; they expire and are capped).
    dead_letters: int = 0
    #: Requests waiting per priority, highest first (at most endpoint_view.SHOWN_LEVELS levels).
    priorities: list[PriorityDepth] = []


class QueuedItem(BaseModel):
    """One queued request, without its parameters."""

    id: str
    method: str
    service: str
    #: None when the body was not read (see `body_read`).
    priority: int | None
    producer: str | None
    created_ms: int
    age_s: float
    body_bytes: int
    #: Why the stored request could not be read (it is listed all the same), else None.
    error: str | None = None
    #: False when the body was too large to read for a listing (over
    #: prq.protocol.dead.BODY_READ_MAX_BYTES, or past the page's BODY_READ_BUDGET_BYTES): its size
    #: and age are right; its method and service are empty, its priority and producer None.
    body_read: bool = True


class QueuedPage(BaseModel):
    """A page of an endpoint's queued requests in the order takes hand them out: highest
    priority first, producers taking turns within a priority (prq.protocol.levels)."""

    endpoint: str
    offset: int
    limit: int
    #: Requests queued in all (the page holds at most `limit` of them).
    total: int
    items: list[QueuedItem]


class RedisHealth(BaseModel):
    """Whether Redis answers, and whether its configuration suits prq (see prq.protocol.health)."""

    ok: bool
    version: str | None = None
    maxmemory_policy: str | None = None
    #: Kinds of persistence in use: "aof", "rdb snapshots"; empty when none.
    persistence: list[str] = []
    #: Why this Redis would lose requests silently or defeat data-loss detection.
    warnings: list[str] = []
    #: Why Redis could not be asked (when `ok` is false).
    error: str | None = None


class RedisMemory(BaseModel):
    """One Redis server's memory and evictions (INFO memory and INFO stats): how close it is
    to refusing writes (prq wants `noeviction`, so a full Redis refuses enqueues with
    QueueFull), or, misconfigured, how many keys it dropped (each one a request lost silently)."""

    #: The server: host:port (a cluster's primary, or the one server), or a Sentinel-managed
    #: primary's master name (its address changes with a failover).
    node: str
    used_memory_bytes: int
    #: Redis's maxmemory; 0 when it has no limit.
    maxmemory_bytes: int
    #: Keys evicted since the server started.
    evicted_keys: int
