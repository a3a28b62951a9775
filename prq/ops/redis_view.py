"""The Inspector's view of Redis itself: whether it answers and suits prq (INFO, judged by
prq.protocol.health), and each server's memory and evictions (every primary of a cluster).
"""

from __future__ import annotations

import asyncio
from typing import Any

from prq.core.errors import PrqError
from prq.ops.answers import RedisHealth, RedisMemory
from prq.ops.reading import InspectorBase, _reading
from prq.protocol.health import INFO_CALLS, parse_info, redis_persistence, redis_warnings
from prq.transport.topology import is_cluster

__all__ = ["RedisView"]


class RedisView(InspectorBase):
    """The Inspector's reads of Redis's health and memory."""

    async def redis_health(self) -> RedisHealth:
        """Ping Redis and judge its configuration from INFO (CONFIG is not granted to prq's
        ACL users); never raises for an unreachable Redis. Why it could not be asked is
        prq's error, as any other read would raise it (`QueueUnavailable: ...`,
        `ConfigurationError: Redis refused the credentials: ...`)."""
        try:
            with _reading():
                pipe = self.client.pipeline(transaction=False)
                for args in INFO_CALLS:
                    pipe.execute_command(*args)
                replies = await pipe.execute()
        except PrqError as exc:
            return RedisHealth(ok=False, error=f"{type(exc).__name__}: {exc}")
        info = parse_info(*replies)
        return RedisHealth(
            ok=True,
            version=info.get("redis_version"),
            maxmemory_policy=info.get("maxmemory_policy"),
            persistence=redis_persistence(info),
            warnings=redis_warnings(info),
        )

    async def redis_memory(self) -> list[RedisMemory]:
        """Each server's memory and evictions: the one server (or Sentinel-managed primary), or
        every primary of a cluster (each holds its own endpoints). QueueUnavailable when Redis
        does not answer."""
        client: Any = self.client  # a cluster client, or not: typed as one server's
        with _reading():
            if is_cluster(client):
                primaries = client.get_primaries()
                replies = await asyncio.gather(
                    *(self._memory_info(target_nodes=node) for node in primaries)
                )
                names = [node.name for node in primaries]
            else:
                replies = [await self._memory_info()]
                names = [_server_name(client)]
        return [
            RedisMemory(
                node=name,
                used_memory_bytes=_int(info.get("used_memory")),
                maxmemory_bytes=_int(info.get("maxmemory")),
                evicted_keys=_int(info.get("evicted_keys")),
            )
            for name, info in zip(names, replies, strict=True)
        ]

    async def _memory_info(self, **target: Any) -> dict[str, str]:
        """INFO memory and INFO stats of one server, merged (two calls: `INFO a b` needs
        Redis 7)."""
        client: Any = self.client
        memory = await client.execute_command("INFO", "memory", **target)
        stats = await client.execute_command("INFO", "stats", **target)
        return parse_info(memory, stats)


def _server_name(client: Any) -> str:
    """A one-server client's host:port (a socket's path), or a Sentinel pool's master name."""
    pool = client.connection_pool
    service_name = getattr(pool, "service_name", None)
    if service_name:
        return str(service_name)
    kwargs = pool.connection_kwargs
    if "path" in kwargs:
        return str(kwargs["path"])
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def _int(value: Any) -> int:
    """An INFO figure as an integer (0 when missing or not one)."""
    try:
        return int(str(value))
    except ValueError:
        return 0
