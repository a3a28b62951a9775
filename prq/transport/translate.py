"""Error translation: redis-py's exceptions to prq's, at the one place every round trip passes.

`translate_errors` maps what redis-py raises (a refused command, bad credentials, a missing ACL
permission, a cluster that cannot tell its layout) to prq's errors, raised `from` the original;
connection-class failures become `RedisUnavailable`, the only kind the retry policy
(prq.transport.budgets) retries. Also the errors a step itself ends with: an error reply of one
of its calls, the queue closed under it, its retry budget spent.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Iterator

import redis
from redis.exceptions import (
    AskError,
    AuthenticationError,
    BusyLoadingError,
    ClusterError,
    MovedError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)

from prq.core.errors import ConfigurationError, PrqError, QueueFull, QueueShutdown, QueueUnavailable
from prq.transport.tls import tls_configuration_error, tls_failure

__all__ = ["RedisUnavailable", "translate_errors"]


class RedisUnavailable(Exception):
    """Internal: a connection-class failure that the retry policy may retry."""


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    """Map redis-py exceptions to prq's; connection-class ones to RedisUnavailable."""
    try:
        yield
    except AuthenticationError as exc:
        raise ConfigurationError(f"Redis refused the credentials: {exc}") from exc
    except NoPermissionError as exc:
        raise ConfigurationError(
            f"the Redis user lacks a permission prq needs: {exc}; see redis-conf/users.acl"
        ) from exc
    # (TRYAGAIN, MOVED, ASK: a cluster node did not run the command, its slot moving or served
    # elsewhere; raised rather than answered in place, a redirection redis-py followed in vain,
    # it is retried like a node that could not be reached, never taken for a refusal)
    except (
        redis.ConnectionError, redis.TimeoutError, BusyLoadingError, ReadOnlyError,
        TryAgainError, MovedError, AskError,
    ) as exc:  # fmt: skip
        tls = tls_failure(exc)
        if tls is not None:
            raise tls_configuration_error(tls) from exc
        raise RedisUnavailable(str(exc)) from exc
    except (ConnectionError, TimeoutError, ssl.SSLError) as exc:  # raised by sockets
        tls = tls_failure(exc)
        if tls is not None:
            raise tls_configuration_error(tls) from exc
        raise RedisUnavailable(str(exc)) from exc
    except NoScriptError:
        raise
    except (RedisClusterException, ClusterError) as exc:
        raise _cluster_error(exc) from exc
    except ResponseError as exc:
        raise _refusal(exc) from exc
    except RedisError as exc:
        raise PrqError(f"unexpected Redis error: {exc}") from exc


def _refusal(exc: ResponseError) -> PrqError:
    """The prq error for a command Redis refused."""
    if isinstance(exc, OutOfMemoryError) or str(exc).startswith("OOM"):
        return QueueFull(
            f"Redis is out of memory and refuses writes: {exc}; free memory or raise "
            "maxmemory (prq needs maxmemory-policy noeviction)"
        )
    if "DB index is out of range" in str(exc):  # (the URL's database, at SELECT)
        return ConfigurationError(
            f"Redis refused the URL's database: {exc} (see the server's 'databases')"
        )
    return PrqError(f"Redis refused a prq command: {exc}")


def _cluster_error(exc: RedisClusterException | ClusterError) -> Exception:
    """redis-py found no node that would tell it the cluster's layout: the nodes are down or
    failing over (retried), or the user may not ask (a configuration error)."""
    if _caused_by(exc, NoPermissionError):
        return ConfigurationError(
            "the Redis user may not read the cluster's layout (CLUSTER SLOTS, COMMAND); see "
            f"redis-conf/users.acl: {exc}"
        )
    # (the asyncio cluster client wraps the seed nodes' refusal of the credentials: the same
    # ConfigurationError as from one server, not a cluster that cannot be reached)
    refused = _cause(exc, AuthenticationError)
    if refused is not None:
        return ConfigurationError(f"Redis refused the credentials: {refused}")
    return RedisUnavailable(str(exc))


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    return _cause(exc, kind) is not None


def _cause(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The first exception of `kind` in `exc`'s chain of causes (itself included), if any."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, kind):
            return cause
        cause = cause.__cause__ or cause.__context__
    return None


def _reply_error(reply: Exception) -> PrqError:
    """The prq error for an error reply of one command."""
    try:
        with translate_errors():
            raise reply
    except PrqError as exc:
        return exc
    except RedisUnavailable as exc:  # e.g. READONLY for one command: Redis is failing over
        return QueueUnavailable(str(exc))
    except NoScriptError as exc:
        return PrqError(f"script missing after reload: {exc}")
    return PrqError(f"unexpected Redis reply: {reply}")  # pragma: no cover


def _closed_error(cause: BaseException | None = None) -> QueueShutdown:
    detail = f" ({cause!r})" if cause is not None else ""
    return QueueShutdown(f"the queue was closed while talking to Redis{detail}")


def _unavailable(exc: RedisUnavailable, budget_s: float) -> QueueUnavailable:
    return QueueUnavailable(
        f"Redis did not answer within the retry budget ({budget_s:g} s): {exc}. "
        "Check that Redis is up and reachable, then retry."
    )
