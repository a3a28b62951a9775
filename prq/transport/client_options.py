"""The redis-py client options every prq connection is made with.

redis-py's own retries are switched off (`Retry(NoBackoff(), 0)`): the retry budget of
prq.transport.budgets is the only one. Replies are read raw (RESP3, bytes), and TLS settings
come from `RedisSettings`.
"""

from __future__ import annotations

import ssl
from typing import Any

import redis.asyncio.retry
from redis.backoff import NoBackoff
from redis.retry import Retry

from prq.core.config import RedisSettings

__all__ = ["asyncio_kwargs", "client_kwargs"]


def client_kwargs(settings: RedisSettings) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "socket_timeout": settings.socket_timeout_s,
        "socket_connect_timeout": settings.connect_timeout_s,
        "max_connections": settings.max_connections,
        "retry": Retry(NoBackoff(), 0),
        "protocol": 3,
        "socket_keepalive": True,
        "decode_responses": False,
        # No CLIENT SETINFO on connect: Redis 7.0 does not know it, and its error reply can
        # end up read as the reply of the first command on a connection that redis-py's
        # cluster client opens while following a redirection.
        "driver_info": None,
    }
    if settings.tls:
        kwargs |= {
            "ssl_cert_reqs": "required",
            "ssl_ca_certs": settings.ssl_ca_file,
            "ssl_certfile": settings.ssl_cert_file,
            "ssl_keyfile": settings.ssl_key_file,
            "ssl_check_hostname": settings.ssl_check_hostname,
            "ssl_min_version": ssl.TLSVersion.TLSv1_2,
        }
    return kwargs


def asyncio_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` of `client_kwargs` for an asyncio client: its retry policy (none) as the
    asyncio kind, which redis-py 8.2 and later expect there (they warn, and drop any custom
    policy, when given the blocking kind)."""
    if isinstance(kwargs.get("retry"), Retry):
        return kwargs | {"retry": redis.asyncio.retry.Retry(NoBackoff(), 0)}
    return kwargs
