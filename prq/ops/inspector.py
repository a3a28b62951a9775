"""A read-only view of a queue for operators: endpoints, their queues, and Redis's health.

`Inspector` reads what the nodes keep in Redis and never changes it, so it runs as the
read-only ACL user of `redis-conf/users.acl`. Where its figures come from:

- endpoints: the registry `prq:endpoints`, where every node lists the endpoints it used lately
  (prq.protocol.presence), newest use first, capped at `max_endpoints`;
- depth: the ids queued over all the endpoint's priority levels (prq.protocol.levels), with the
  depth of each level: withdrawn and cancelled ids leave them (see withdraw.lua); ids whose sender
  died without withdrawing stay until a take skips them;
- in flight: the endpoint's in-flight set, counting entries touched (taken or beaten) within a
  request's in-flight TTL;
- oldest age: the creation time of the oldest live request among the first few of each level;
- receivers: nodes that reported taking from the endpoint within a few report intervals (nodes
  report every 5 s, see prq.protocol.presence);
- limits: the endpoint's capacity limits hash (prq.protocol.limits), read in the same round trip; a
  stored value that is not a positive integer shows as None (no limit) and logs a warning;
- dead letters: the size of the endpoint's dead-letter set (prq.protocol.dead), in the same round
  trip; `dead_letters()` lists them with prq.protocol.dead's own listing flow, driven here with
  reads only;
- queued requests and dead letters: a stored body (up to max_body_bytes) is read only within
  prq.protocol.dead's bounds (BODY_READ_MAX_BYTES each, BODY_READ_BUDGET_BYTES per listing), its
  size always coming from HSTRLEN; one listed beyond them shows its size only (`body_read=False`).

The Inspector is put together from its views, each a mixin on prq.ops.reading's InspectorBase:
prq.ops.endpoint_view (endpoints and limits), prq.ops.queue_view (queued requests and dead
letters) and prq.ops.redis_view (Redis's health and memory); it answers with prq.ops.answers'
models.

Each figure is read in a few pipelined round trips however many endpoints there are, so the
admin service can collect them on every scrape. Changes (cancel) go through the queue API.
"""

from __future__ import annotations

from typing import Self

import redis.asyncio

from prq.core.config import QueueSettings, RedisSettings
from prq.core.keys import KeySchema
from prq.ops.endpoint_view import EndpointView
from prq.ops.queue_view import QueueView
from prq.ops.redis_view import RedisView
from prq.transport.client_options import client_kwargs
from prq.transport.topology import aclose_client, async_client

__all__ = ["INSPECTOR_MAX_CONNECTIONS", "Inspector"]


#: The most connections an inspector opens (it had 4: a dashboard refresh from two tabs then
#: got 503s).
INSPECTOR_MAX_CONNECTIONS = 64


class Inspector(EndpointView, QueueView, RedisView):
    """Reads the state of one key prefix for operators; never writes.

    Example:
        inspector = Inspector.from_url("redis://localhost:6379/0")
        for info in await inspector.endpoints():
            print(info.endpoint, info.depth, info.in_flight)
        await inspector.aclose()
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        *,
        prefix: str = "prq",
        settings: QueueSettings | None = None,
        max_endpoints: int = 1000,
    ) -> None:
        self.client = client
        self.keys = KeySchema(prefix)
        self.settings = settings or QueueSettings()
        self.max_endpoints = max_endpoints

    @classmethod
    def from_url(
        cls,
        url: str | None = None,
        *,
        prefix: str = "prq",
        settings: QueueSettings | None = None,
        redis_settings: RedisSettings | None = None,
    ) -> Self:
        """An inspector with its own connection pool (`url` or `PRQ_REDIS_URL`), of at most
        INSPECTOR_MAX_CONNECTIONS: redis-py refuses a read past that at once ("Too many
        connections"), so it holds what concurrent readers need (a dashboard refresh reads four
        or five views at once, per browser tab, beside the admin service's sampler)."""
        rs = redis_settings or RedisSettings.from_url(url)
        kwargs = client_kwargs(rs) | {"max_connections": INSPECTOR_MAX_CONNECTIONS}
        return cls(async_client(rs.url, kwargs), prefix=prefix, settings=settings)

    async def aclose(self) -> None:
        await aclose_client(self.client)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
