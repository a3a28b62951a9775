"""Where Redis is: one server, or a primary that Redis Sentinel manages, named by a URL.

    redis://[user:password@]host:port/db          one server (rediss:// with TLS)
    redis+sentinel://[user:password@]host:port[,host:port...]/<master name>[/db]
                                                  the primary the sentinels name for <master
                                                  name> (rediss+sentinel:// with TLS to it)

With Sentinel the clients ask the sentinels where the primary is when they connect, and a
connection to a primary that was demoted (a failover) is dropped and made again to the new
one (redis-py's sentinel support): prq's retries within the retry budget carry a call across
a failover, and a failover to a replica that missed writes is data loss, detected as on one
server. The user and password are the data nodes' (the sentinels are asked without them).
    redis+cluster://[user:password@]host:port[,host:port...][/0]
                                                  a Redis Cluster, found from any of its nodes
                                                  (rediss+cluster:// with TLS); database 0 only

With a cluster redis-py finds the slots' owners from the seed nodes and follows MOVED and ASK
redirections; every prq script runs on its endpoint's slot (one hash tag per endpoint).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis.maint_notifications import MaintNotificationsConfig

from prq.core.errors import ConfigurationError
from prq.transport.client_options import asyncio_kwargs

__all__ = [
    "AsyncClient",
    "Location",
    "SyncClient",
    "aclose_client",
    "async_client",
    "close_client",
    "is_cluster",
    "locate",
    "redact_url",
    "sync_client",
]

_SERVER_SCHEMES = frozenset({"redis", "rediss", "unix"})
_SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}
_CLUSTER_SCHEMES = {"redis+cluster": False, "rediss+cluster": True}
DEFAULT_SENTINEL_PORT = 26379
DEFAULT_REDIS_PORT = 6379

#: A client of one server (or a Sentinel-managed primary), or of a cluster.
SyncClient = redis.Redis | redis.cluster.RedisCluster
AsyncClient = redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster


@dataclass(frozen=True, slots=True)
class Location:
    """A parsed Redis URL: a server's URL as given, or the sentinels and the master's name."""

    url: str
    sentinels: tuple[tuple[str, int], ...] = ()
    master: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    #: The seed nodes of a cluster (empty for one server or Sentinel).
    cluster_nodes: tuple[tuple[str, int], ...] = ()

    @property
    def sentinel(self) -> bool:
        return bool(self.sentinels)

    @property
    def cluster(self) -> bool:
        return bool(self.cluster_nodes)


def locate(url: str) -> Location:
    """Parse `url`; ConfigurationError, at once, for a URL that names no topology prq supports
    or that is malformed (a server URL is checked as redis-py parses it)."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if scheme in _CLUSTER_SCHEMES:
        return _locate_cluster(url, scheme, rest)
    if scheme in _SERVER_SCHEMES and sep:
        try:
            redis.connection.parse_url(url)  # type: ignore[no-untyped-call, unused-ignore]
            path = urlsplit(url).path.strip("/")
            if scheme != "unix" and path and not path.isdigit():  # (redis-py would ignore it)
                raise ValueError(f"the database is not a number: {path!r}")
        except ValueError as exc:
            raise ConfigurationError(
                f"the Redis URL {redact_url(url)!r} is malformed: {exc}"
            ) from None
        return Location(url=url)
    if scheme not in _SENTINEL_SCHEMES or not sep:
        raise ConfigurationError(
            f"{redact_url(url)!r} is not a Redis URL: prq takes redis://host:port/db (rediss:// "
            "with TLS, unix:///path/to/socket), redis+sentinel://host:port/<master name> or "
            "redis+cluster://host:port"
        )
    if not rest:
        raise ConfigurationError(f"{scheme}:// URL names no sentinel: {url!r}")
    credentials, _, hosts_and_path = rest.rpartition("@")
    hosts, _, path = hosts_and_path.partition("/")
    sentinels = tuple(
        _address(part, url, DEFAULT_SENTINEL_PORT) for part in hosts.split(",") if part.strip()
    )
    parts = [unquote(p) for p in path.split("/") if p]
    if not sentinels or not 1 <= len(parts) <= 2:
        raise ConfigurationError(
            f"a sentinel URL is {scheme}://host:port[,host:port...]/<master name>[/db]; got {url!r}"
        )
    db = 0
    if len(parts) == 2:
        if not parts[1].isdigit():
            raise ConfigurationError(f"the database of {url!r} is not a number: {parts[1]!r}")
        db = int(parts[1])
    username, password = _credentials(credentials)
    return Location(
        url=url, sentinels=sentinels, master=parts[0], db=db, username=username,
        password=password, tls=_SENTINEL_SCHEMES[scheme],
    )  # fmt: skip


def redact_url(url: str) -> str:
    """`url` with its password replaced by `***`, for messages and logs."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        where = parts.netloc.rpartition("@")[2]  # (as written: a bad port must not hide it)
        return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{where}"))
    except ValueError:
        return "<unparsable URL>"


def _locate_cluster(url: str, scheme: str, rest: str) -> Location:
    credentials, _, hosts_and_path = rest.rpartition("@")
    hosts, _, path = hosts_and_path.partition("/")
    path, _, query = path.partition("?")
    nodes = tuple(
        _address(part, url, DEFAULT_REDIS_PORT) for part in hosts.split(",") if part.strip()
    )
    if not nodes:
        raise ConfigurationError(f"{scheme}:// URL names no node: {url!r}")
    if path.strip("/") not in ("", "0"):
        raise ConfigurationError(f"a Redis Cluster has database 0 only; {url!r} names another")
    if query:
        raise ConfigurationError(f"{scheme}:// URLs take no options; got {url!r}")
    username, password = _credentials(credentials)
    return Location(
        url=url, username=username, password=password, tls=_CLUSTER_SCHEMES[scheme],
        cluster_nodes=nodes,
    )  # fmt: skip


def _credentials(credentials: str) -> tuple[str | None, str | None]:
    if not credentials:
        return None, None
    user, has_password, secret = credentials.partition(":")
    return unquote(user) or None, unquote(secret) if has_password else None


def _address(part: str, url: str, default_port: int) -> tuple[str, int]:
    parsed = urlsplit(f"//{part.strip()}")
    try:
        port = parsed.port or default_port
    except ValueError:
        raise ConfigurationError(f"a port in {url!r} is not a number") from None
    if not parsed.hostname:
        raise ConfigurationError(f"a host of {url!r} is missing: {part!r}")
    return parsed.hostname, port


def _sentinel_kwargs(where: Location, kwargs: dict[str, Any]) -> dict[str, Any]:
    """What the clients of the sentinels themselves get: the timeouts, and TLS when the data
    nodes use it (no credentials, no pool size)."""
    chosen = {k: v for k, v in kwargs.items() if k.startswith("socket_") or k == "protocol"}
    if where.tls:
        chosen |= {k: v for k, v in kwargs.items() if k.startswith("ssl")} | {"ssl": True}
    return chosen


def _master_kwargs(where: Location, kwargs: dict[str, Any]) -> dict[str, Any]:
    master = dict(kwargs, db=where.db, username=where.username, password=where.password)
    if where.tls:
        master["ssl"] = True
    else:
        master = {k: v for k, v in master.items() if not k.startswith("ssl")}
    return master


def _cluster_kwargs(where: Location, kwargs: dict[str, Any]) -> dict[str, Any]:
    chosen = _master_kwargs(where, kwargs)
    del chosen["db"]
    # Every failure reaches prq's one retry policy; redis-py follows redirections itself.
    # No CLIENT MAINT_NOTIFICATIONS on connect (redis-py's default for a RESP3 cluster client):
    # a server before Redis 8 refuses it, and that error reply, like CLIENT SETINFO's
    # (client_options.client_kwargs), can be read as the reply of a command on a connection the
    # client opened while following a redirection (seen in fault scenario 20: a call failed
    # with that refusal although its request ran).
    return chosen | {
        "require_full_coverage": False,
        "maint_notifications_config": MaintNotificationsConfig(enabled=False),
    }


def is_cluster_url(url: str) -> bool:
    """Whether `url` names a Redis Cluster (redis+cluster://, rediss+cluster://)."""
    return url.partition("://")[0].lower() in _CLUSTER_SCHEMES


def is_cluster(client: object) -> bool:
    """Whether `client` (of `sync_client` or `async_client`) talks to a Redis Cluster."""
    return isinstance(client, redis.cluster.RedisCluster | redis.asyncio.cluster.RedisCluster)


def sync_client(url: str, kwargs: dict[str, Any]) -> Any:
    """A blocking client for `url` with the connection options `kwargs`: a redis.Redis, or a
    redis.cluster.RedisCluster for a cluster URL (typed Any: the two share no base class)."""
    where = locate(url)
    if where.cluster:
        return redis.cluster.RedisCluster(
            startup_nodes=[
                redis.cluster.ClusterNode(h, p)  # type: ignore[no-untyped-call, unused-ignore]
                for h, p in where.cluster_nodes
            ],
            **_cluster_kwargs(where, kwargs),
        )
    if not where.sentinel:
        return redis.Redis.from_url(url, **kwargs)
    sentinels = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
        list(where.sentinels), sentinel_kwargs=_sentinel_kwargs(where, kwargs)
    )
    client: redis.Redis = sentinels.master_for(  # type: ignore[no-untyped-call, unused-ignore]
        where.master, **_master_kwargs(where, kwargs)
    )
    return client


def async_client(url: str, kwargs: dict[str, Any]) -> Any:
    """An asyncio client for `url` with the connection options `kwargs`: a redis.asyncio.Redis,
    or a redis.asyncio.cluster.RedisCluster for a cluster URL (typed Any, as sync_client)."""
    where = locate(url)
    kwargs = asyncio_kwargs(kwargs)
    if where.cluster:
        return redis.asyncio.cluster.RedisCluster(
            startup_nodes=[redis.asyncio.cluster.ClusterNode(h, p) for h, p in where.cluster_nodes],
            **_cluster_kwargs(where, kwargs),
        )
    if not where.sentinel:
        return redis.asyncio.Redis.from_url(url, **kwargs)
    sentinels = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
        list(where.sentinels), sentinel_kwargs=_sentinel_kwargs(where, kwargs)
    )
    client: redis.asyncio.Redis = sentinels.master_for(
        where.master, **_master_kwargs(where, kwargs)
    )
    return client


def close_client(client: Any) -> None:
    """Close a blocking client of `sync_client`, with its clients of the sentinels."""
    client.close()
    manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", ()):
        sentinel.close()


async def aclose_client(client: Any) -> None:
    """Close an asyncio client of `async_client`, with its clients of the sentinels."""
    await client.aclose()
    manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", ()):
        await sentinel.aclose()
