"""The I/O boundary: connections, error translation, the one retry policy, script loading.

Every Redis round trip of the queue goes through `AsyncRedisIO.execute` or `SyncRedisIO.execute`:
- redis-py errors are translated in `translate_errors` (and raised `from` the original);
- connection-class errors are retried with exponential backoff and jitter for up to
  `QueueSettings.retry_budget_s`, then surface as `QueueUnavailable`; redis-py's own retries
  are switched off so the budget is the only one;
- NOSCRIPT (Redis restarted or flushed its script cache) loads the scripts and sends again.
Every prq write is idempotent when replayed, which is what makes retrying writes safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    NoPermissionError,
    NoScriptError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.retry import Retry
from tenacity import (
    AsyncRetrying,
    Retrying,
    before_sleep_log,
    retry_if_exception_type,
    stop_before_delay,
    wait_random_exponential,
)

from prq._types import Call, Reply
from prq.config import QueueSettings, RedisSettings
from prq.errors import ConfigurationError, PrqError, QueueFull, QueueUnavailable
from prq.scripts import script_load_calls

logger = logging.getLogger(__name__)

__all__ = ["AsyncRedisIO", "RedisUnavailable", "SyncRedisIO", "translate_errors"]

#: First backoff between retries, seconds.
DEFAULT_RETRY_INITIAL_S = 0.05
#: Largest backoff between retries, seconds.
DEFAULT_RETRY_MAX_S = 2.0


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
    except (redis.ConnectionError, redis.TimeoutError, BusyLoadingError, ReadOnlyError) as exc:
        raise RedisUnavailable(str(exc)) from exc
    except (ConnectionError, TimeoutError) as exc:  # the builtins, raised by sockets
        raise RedisUnavailable(str(exc)) from exc
    except NoScriptError:
        raise
    except ResponseError as exc:
        if str(exc).startswith("OOM"):
            raise QueueFull(
                f"Redis is out of memory and refuses writes: {exc}; free memory or raise "
                "maxmemory (prq needs maxmemory-policy noeviction)"
            ) from exc
        raise PrqError(f"Redis refused a prq command: {exc}") from exc
    except RedisError as exc:
        raise PrqError(f"unexpected Redis error: {exc}") from exc


def _retry_kwargs(settings: QueueSettings) -> dict[str, Any]:
    return {
        "retry": retry_if_exception_type(RedisUnavailable),
        "stop": stop_before_delay(settings.retry_budget_s),
        "wait": wait_random_exponential(
            multiplier=DEFAULT_RETRY_INITIAL_S, max=DEFAULT_RETRY_MAX_S
        ),
        "before_sleep": before_sleep_log(logger, logging.DEBUG),
        "reraise": True,
    }


def _client_kwargs(settings: RedisSettings) -> dict[str, Any]:
    return {
        "socket_timeout": settings.socket_timeout_s,
        "socket_connect_timeout": settings.connect_timeout_s,
        "max_connections": settings.max_connections,
        "retry": Retry(NoBackoff(), 0),
        "socket_keepalive": True,
        "decode_responses": False,
    }


def _unavailable(exc: RedisUnavailable, budget_s: float) -> QueueUnavailable:
    return QueueUnavailable(
        f"Redis did not answer within the retry budget ({budget_s:g} s): {exc}. "
        "Check that Redis is up and reachable, then retry."
    )


class _Counters:
    """Client-side counts, for tests and metrics: commands sent and round trips made."""

    def __init__(self) -> None:
        self.commands = 0
        self.round_trips = 0
        self.retries = 0

    def count(self, calls: Sequence[Call]) -> None:
        self.commands += len(calls)
        self.round_trips += 1


def _check(replies: list[Reply]) -> list[Reply]:
    for reply in replies:
        if isinstance(reply, Exception):
            with translate_errors():
                raise reply
    return replies


class AsyncRedisIO(_Counters):
    """Round trips to Redis for the asyncio queue."""

    def __init__(self, redis_settings: RedisSettings, settings: QueueSettings) -> None:
        super().__init__()
        self.settings = settings
        self.redis_settings = redis_settings
        self.client: redis.asyncio.Redis = redis.asyncio.Redis.from_url(
            redis_settings.url, **_client_kwargs(redis_settings)
        )
        self._retry = _retry_kwargs(settings)
        #: Bounds one execute(): the budget, one more attempt's socket timeout, and a margin.
        self._deadline_s = settings.retry_budget_s + redis_settings.socket_timeout_s + 1.0

    async def execute(self, calls: Sequence[Call]) -> list[Reply]:
        """Send `calls` in one round trip; retry on connection errors within the budget."""
        try:
            async with asyncio.timeout(self._deadline_s):
                async for attempt in AsyncRetrying(**self._retry):
                    with attempt:
                        if attempt.retry_state.attempt_number > 1:
                            self.retries += 1
                        return await self._send(calls)
        except RedisUnavailable as exc:
            raise _unavailable(exc, self.settings.retry_budget_s) from exc
        except TimeoutError as exc:
            raise _unavailable(RedisUnavailable("deadline passed"), self._deadline_s) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def _send(self, calls: Sequence[Call]) -> list[Reply]:
        self.count(calls)
        try:
            with translate_errors():
                return _check(await self._raw(calls))
        except NoScriptError:
            await self.load_scripts()
            self.count(calls)
            with translate_errors():
                return _check(await self._raw(calls))

    async def _raw(self, calls: Sequence[Call]) -> list[Reply]:
        if len(calls) == 1:
            return [await self.client.execute_command(*calls[0].args)]  # type: ignore[no-untyped-call]
        async with self.client.pipeline(transaction=False) as pipe:
            for call in calls:
                pipe.execute_command(*call.args)
            result: list[Reply] = await pipe.execute(raise_on_error=False)
            return result

    async def load_scripts(self) -> None:
        """SCRIPT LOAD every prq script (after a restart or SCRIPT FLUSH)."""
        logger.info("loading prq scripts into Redis")
        with translate_errors():
            _check(await self._raw(script_load_calls()))

    async def aclose(self) -> None:
        await self.client.aclose()


class SyncRedisIO(_Counters):
    """Round trips to Redis for the blocking queue."""

    def __init__(self, redis_settings: RedisSettings, settings: QueueSettings) -> None:
        super().__init__()
        self.settings = settings
        self.redis_settings = redis_settings
        self.client: redis.Redis = redis.Redis.from_url(
            redis_settings.url, **_client_kwargs(redis_settings)
        )
        self._retry = _retry_kwargs(settings)

    def execute(self, calls: Sequence[Call]) -> list[Reply]:
        """Send `calls` in one round trip; retry on connection errors within the budget."""
        try:
            for attempt in Retrying(**self._retry):
                with attempt:
                    if attempt.retry_state.attempt_number > 1:
                        self.retries += 1
                    return self._send(calls)
        except RedisUnavailable as exc:
            raise _unavailable(exc, self.settings.retry_budget_s) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _send(self, calls: Sequence[Call]) -> list[Reply]:
        self.count(calls)
        try:
            with translate_errors():
                return _check(self._raw(calls))
        except NoScriptError:
            self.load_scripts()
            self.count(calls)
            with translate_errors():
                return _check(self._raw(calls))

    def _raw(self, calls: Sequence[Call]) -> list[Reply]:
        if len(calls) == 1:
            return [self.client.execute_command(*calls[0].args)]  # type: ignore[no-untyped-call]
        with self.client.pipeline(transaction=False) as pipe:
            for call in calls:
                pipe.execute_command(*call.args)  # type: ignore[no-untyped-call]
            result: list[Reply] = pipe.execute(raise_on_error=False)
            return result

    def load_scripts(self) -> None:
        """SCRIPT LOAD every prq script (after a restart or SCRIPT FLUSH)."""
        logger.info("loading prq scripts into Redis")
        with translate_errors():
            _check(self._raw(script_load_calls()))

    def close(self) -> None:
        self.client.close()
