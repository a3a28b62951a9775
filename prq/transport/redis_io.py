"""The I/O boundary: connections, error translation, the one retry policy, script loading.

Every Redis round trip of the queue goes through `AsyncRedisIO.execute` or `SyncRedisIO.execute`:
- redis-py errors are translated in `translate_errors` (and raised `from` the original);
- connection-class errors are retried with exponential backoff and jitter until
  `QueueSettings.retry_budget_s` has passed since the step was asked for, then surface as
  `QueueUnavailable`: never sooner (the last back-off is cut short so that one more attempt
  is made when the budget ends), and no later than one attempt after it (see `StepBudgets`);
  redis-py's own retries are switched off so the budget is the only one;
- NOSCRIPT (Redis restarted or flushed its script cache) loads the scripts and sends again.
Every prq write is idempotent when replayed, which is what makes retrying writes safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.exceptions import (
    AskError,
    AuthenticationError,
    BusyLoadingError,
    ClusterDownError,
    ClusterError,
    MovedError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.retry import Retry
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    before_sleep_log,
    retry_if_exception_type,
)

from prq.core.config import QueueSettings, RedisSettings
from prq.core.errors import ConfigurationError, PrqError, QueueFull, QueueShutdown, QueueUnavailable
from prq.core.jitter import wait_jittered_exponential
from prq.observe import metrics
from prq.protocol.effects import Call, Reply
from prq.protocol.scripts.loading import script_load_calls
from prq.protocol.scripts.merging import merge_calls
from prq.transport.links import AsyncClusterLink, async_link
from prq.transport.topology import aclose_client, async_client, locate, redact_url

logger = logging.getLogger(__name__)

__all__ = [
    "AsyncRedisIO",
    "IOCounters",
    "RedisUnavailable",
    "StepBudgets",
    "translate_errors",
]

#: Replies in place of one call's that a retry may mend: its node could not be reached, or a
#: cluster was failing over or moving its slot (a round trip on a cluster gets some of these
#: while its other calls are answered; ClusterError: redis-py followed redirections and
#: TRYAGAIN replies as long as it would, "TTL exhausted").
TRANSIENT_REPLIES = (
    redis.ConnectionError, redis.TimeoutError, ClusterDownError, TryAgainError,
    SlotNotCoveredError, MovedError, AskError, ClusterError,
)  # fmt: skip

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
    return RedisUnavailable(str(exc))


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, kind):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


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


#: TLS failures that a retry cannot mend: the certificate chain or name does not verify, or the
#: server refused the handshake (no or a wrong client certificate, plaintext server, versions).
#: An EOF or reset in the middle of a handshake is not among them: a restart can cause those.
_TLS_TRANSIENT = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLWantReadError)


def tls_failure(exc: BaseException) -> ssl.SSLError | None:
    """The TLS error behind a connection failure, if it is one a retry cannot mend."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ssl.SSLError) and not isinstance(cause, _TLS_TRANSIENT):
            return cause
        cause = cause.__cause__ or cause.__context__
    return None


def tls_eof(exc: BaseException) -> bool:
    """Whether a connection failure is a TLS connection that ended without saying why."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ssl.SSLEOFError | ssl.SSLZeroReturnError):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def tls_probe(settings: RedisSettings) -> ssl.SSLError | None:
    """Ask the server why a TLS connection ended: connect once more and read before writing.

    Under TLS 1.3 a server refuses a missing or unknown client certificate only after the
    handshake, with an alert. A client that writes first can race the server's close and see a
    bare EOF, which a restart also causes, so it would retry for its whole budget. Reading first
    gets the alert. Returns the refusal a retry cannot mend; None if the server is fine with
    this client or did not say (it was restarting, or is slow): the caller retries then.
    """
    if locate(settings.url).sentinel:
        return None  # the primary's address is the sentinels' to tell: no probe, retry
    parts = urlsplit(settings.url)
    host = parts.hostname or "localhost"
    context = ssl.create_default_context(cafile=settings.ssl_ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = settings.ssl_check_hostname
    if settings.ssl_cert_file is not None:
        context.load_cert_chain(settings.ssl_cert_file, settings.ssl_key_file)
    try:
        with (
            socket.create_connection(
                (host, parts.port or 6379), timeout=settings.connect_timeout_s
            ) as raw,
            context.wrap_socket(raw, server_hostname=host) as tls,
        ):
            tls.settimeout(TLS_PROBE_WAIT_S)
            tls.recv(1)  # a healthy server says nothing until asked: this times out
    except ssl.SSLError as exc:
        return tls_failure(exc)
    except OSError:
        return None
    return None


#: How long a TLS probe waits for the server's alert after the handshake.
TLS_PROBE_WAIT_S = 1.0


def tls_configuration_error(error: ssl.SSLError) -> ConfigurationError:
    if isinstance(error, ssl.SSLCertVerificationError):
        what = (
            f"the server's certificate did not verify ({error.verify_message}): check "
            "ssl_ca_file (the CA that signed it) and that the URL's host is a name the "
            "certificate holds"
        )
    else:
        what = (
            f"the TLS handshake failed ({error.reason or error}): check the client "
            "certificate (ssl_cert_file, ssl_key_file) if the server requires one, and that "
            "the server speaks TLS on that port"
        )
    return ConfigurationError(f"cannot connect to Redis over TLS: {what}")


def _closed_error(cause: BaseException | None = None) -> QueueShutdown:
    detail = f" ({cause!r})" if cause is not None else ""
    return QueueShutdown(f"the queue was closed while talking to Redis{detail}")


def _unavailable(exc: RedisUnavailable, budget_s: float) -> QueueUnavailable:
    return QueueUnavailable(
        f"Redis did not answer within the retry budget ({budget_s:g} s): {exc}. "
        "Check that Redis is up and reachable, then retry."
    )


#: A step gives up this long after its retry budget and one socket timeout: the documented bound
#: for QueueUnavailable is budget + socket timeout + 1 s, and this leaves room for scheduling.
STEP_GRACE_S = 0.5
#: Most steps one batched round trip carries (bounds the size of one pipeline).
DEFAULT_MAX_BATCH_STEPS = 512
#: Round trips an asyncio node keeps in flight on its link (pipelined: Redis runs one batch
#: while the node reads and acts on the other).
MAX_ROUND_TRIPS_IN_FLIGHT = 2


class IOCounters:
    """Client-side counts, for tests and metrics: commands sent and round trips made."""

    def __init__(self) -> None:
        self.commands = 0
        self.round_trips = 0
        self.retries = 0

    def count(self, calls: Sequence[Call]) -> None:
        self.commands += len(calls)
        self.round_trips += 1


class Reachability:
    """Says once, at WARNING, that Redis does not answer while round trips are being retried
    (a wrong host or port, Redis down or failing over), and once, at INFO, that it answers
    again: an unreachable Redis is never silent for a whole retry budget."""

    def __init__(self, url: str, budget_s: float) -> None:
        self.url = repr(redact_url(url))
        self.budget_s = budget_s
        self.down = False

    def failed(self, exc: Exception) -> None:
        if not self.down:
            self.down = True
            logger.warning(
                "redis does not answer at %s; retrying for up to %g s: %s",
                self.url, self.budget_s, exc,
            )  # fmt: skip

    def answered(self) -> None:
        if self.down:
            self.down = False
            logger.info("redis answers again at %s", self.url)


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


def _split(steps: Sequence[Sequence[Call]], replies: list[Reply]) -> list[list[Reply] | PrqError]:
    """Cut a batch's replies back into one list per step; a step with an error reply fails."""
    results: list[list[Reply] | PrqError] = []
    start = 0
    for calls in steps:
        part = replies[start : start + len(calls)]
        start += len(calls)
        error = next((r for r in part if isinstance(r, Exception)), None)
        results.append(_reply_error(error) if error is not None else part)
    return results


#: What a step ends with: its replies, or the error that ended it.
Outcome = list[Reply] | PrqError


class StepBudgets:
    """The steps one round trip carries, each with its own retry budget, while Redis fails.

    A step's budget is counted from when it was asked for. After each failed attempt the steps
    whose budget has run out are settled with QueueUnavailable and left out of later attempts;
    the others are tried again after a full-jitter backoff cut short at the next step's
    deadline. So every step gets its last attempt when its budget ends: it never fails sooner
    than its budget (giving up instead of a backoff that would cross the budget could end it
    at a fraction of it), nor later than that one attempt (a socket timeout at most).
    `retrying()` is that policy for tenacity; the clock is injectable for tests (with
    tenacity's `sleep=`).
    """

    def __init__(
        self,
        steps: Sequence[Sequence[Call]],
        asked: Sequence[float],
        budget_s: float,
        settle: Callable[[int, Outcome], None],
        clock: Callable[[], float] = time.monotonic,
        hand_over: Callable[[], bool] | None = None,
    ) -> None:
        self.steps = steps
        self.budget_s = budget_s
        self.deadlines = [at + budget_s for at in asked]
        #: Indexes of the steps still tried, in batch order.
        self.live = list(range(len(steps)))
        self._settle = settle
        self._clock = clock
        #: True once whoever sends the attempts must stop (the steps still live are left
        #: unsettled, for that sender to pass on); None: never.
        self._hand_over = hand_over
        self._backoff = wait_jittered_exponential(
            multiplier=DEFAULT_RETRY_INITIAL_S, max=DEFAULT_RETRY_MAX_S
        )

    def calls(self) -> list[Call]:
        """The calls of the steps still tried, for the next attempt."""
        return [call for i in self.live for call in self.steps[i]]

    def answered(self, replies: list[Reply]) -> None:
        """Settle the steps still tried with their share of an attempt's replies. A step with
        a reply that is a connection failure (on a cluster, the round trip reached some nodes
        and not others) stays live, and RedisUnavailable is raised for the retry policy."""
        live, self.live = self.live, []
        start = 0
        failure: BaseException | None = None
        for i in live:
            part = replies[start : start + len(self.steps[i])]
            start += len(self.steps[i])
            transient = next((r for r in part if isinstance(r, TRANSIENT_REPLIES)), None)
            if transient is not None:
                self.live.append(i)
                failure = failure or transient
                continue
            self._settle(i, _split([self.steps[i]], part)[0])
        if failure is not None:
            raise RedisUnavailable(str(failure)) from failure

    def failed(self, error: RedisUnavailable) -> None:
        """After a failed attempt: give up the steps whose budget has run out."""
        now = self._clock()
        spent = [i for i in self.live if self.deadlines[i] <= now]
        self.live = [i for i in self.live if self.deadlines[i] > now]
        for i in spent:
            self._settle(i, _unavailable(error, self.budget_s))

    def give_up(self, error: PrqError) -> None:
        """Settle every step still tried with `error` (the round trip cannot go on)."""
        live, self.live = self.live, []
        for i in live:
            self._settle(i, error)

    def remaining_s(self) -> float:
        """Time until the last budget of the steps still tried runs out (0 when none)."""
        if not self.live:
            return 0.0
        return max(self.deadlines[i] for i in self.live) - self._clock()

    def retrying(self) -> dict[str, Any]:
        """Keyword arguments of a tenacity (Async)Retrying that carries out this policy."""
        return {
            "retry": retry_if_exception_type(RedisUnavailable),
            "after": self._after_failure,
            "wait": self._wait,
            "stop": self._all_given_up,
            "before_sleep": before_sleep_log(logger, logging.DEBUG),
            "reraise": True,
        }

    def _after_failure(self, retry_state: RetryCallState) -> None:
        assert retry_state.outcome is not None
        error = retry_state.outcome.exception()
        assert isinstance(error, RedisUnavailable)  # the only kind retried
        self.failed(error)

    def handing_over(self) -> bool:
        """Whether the attempts stop here with steps still live (see `hand_over`)."""
        return bool(self.live) and self._hand_over is not None and self._hand_over()

    def _wait(self, retry_state: RetryCallState) -> float:
        """The backoff, cut short at the next deadline of a step still tried."""
        if not self.live or self.handing_over():
            return 0.0
        next_deadline = min(self.deadlines[i] for i in self.live)
        return max(0.0, min(self._backoff(retry_state), next_deadline - self._clock()))

    def _all_given_up(self, retry_state: RetryCallState) -> bool:
        return not self.live or self.handing_over()


def _fail_step(future: asyncio.Future[list[Reply]], error: BaseException) -> None:
    """Fail a waiting step. Its waiter (if it still waits) gets the error when it awaits; one
    that gave up (cancelled) never will, so mark the error seen rather than have asyncio log
    "exception was never retrieved" for it."""
    future.set_exception(error)
    future.exception()


def _settle_step(future: asyncio.Future[list[Reply]], result: Outcome) -> None:
    if future.done():  # its waiter gave up
        return
    if isinstance(result, PrqError):
        _fail_step(future, result)
    else:
        future.set_result(result)


def _needs_scripts(replies: list[Reply]) -> bool:
    return any(isinstance(reply, NoScriptError) for reply in replies)


class AsyncRedisIO(IOCounters):
    """Round trips to Redis for the asyncio queue.

    Steps (a few calls each) are sent in batches: while MAX_ROUND_TRIPS_IN_FLIGHT pipelined
    round trips are in flight, the steps that other tasks want to send wait and then go
    together in the next one. A step that finds the link with room is sent at once by its own
    task, so batching adds no latency, and under load it saves most round trips. The first
    attempt is plain; the retry machinery is built only after a connection failure. Batches
    are safe to retry because every prq step is idempotent on replay; each step in one keeps
    its own retry budget (StepBudgets).
    """

    def __init__(self, redis_settings: RedisSettings, settings: QueueSettings) -> None:
        super().__init__()
        self.settings = settings
        self.redis_settings = redis_settings
        self.client: Any = async_client(redis_settings.url, client_kwargs(redis_settings))
        self._pending: list[tuple[Sequence[Call], asyncio.Future[list[Reply]]]] = []
        #: When each pending future was asked for (monotonic), keyed by the future.
        self._asked: dict[asyncio.Future[list[Reply]], float] = {}
        #: Tasks sending queued steps, and round trips in flight (theirs and direct ones).
        self._flushers: set[asyncio.Future[None]] = set()
        self._in_flight = 0
        self._closed = False
        self._link = async_link(self.client)
        self.reachability = Reachability(redis_settings.url, settings.retry_budget_s)
        #: Whether a step's retries may run beside the batcher (a cluster: each pipeline has
        #: connections of its own); one server's link is pipelined (AsyncLink).
        self._overlapping = isinstance(self._link, AsyncClusterLink)
        self._retrying: set[asyncio.Future[None]] = set()
        self._step_deadline_s = (
            settings.retry_budget_s + redis_settings.socket_timeout_s + STEP_GRACE_S
        )

    async def execute(self, calls: Sequence[Call]) -> list[Reply]:
        """Send one step's calls (alone if the link has room, else in the next batch)."""
        if self._closed:
            raise _closed_error()
        if self._in_flight < MAX_ROUND_TRIPS_IN_FLIGHT and not self._pending:
            self._in_flight += 1
            mine: asyncio.Future[list[Reply]] = asyncio.get_running_loop().create_future()
            budget_s = self.settings.retry_budget_s
            try:
                await self._send(
                    StepBudgets(
                        [calls],
                        [time.monotonic()],
                        budget_s,
                        lambda _, r: _settle_step(mine, r),
                    )
                )
            finally:
                self._in_flight -= 1
                self._start_flusher()
            if mine.done():
                return mine.result()  # raises the step's error
            (result,) = await self._wait_steps([mine])  # retried off the batcher (a cluster)
            if isinstance(result, PrqError):
                raise result
            return result
        future: asyncio.Future[list[Reply]] = asyncio.get_running_loop().create_future()
        self._pending.append((calls, future))
        self._asked[future] = time.monotonic()
        self._start_flusher()
        result = (await self._wait_steps([future]))[0]
        if isinstance(result, PrqError):
            raise result
        return result

    async def _wait_steps(
        self, futures: list[asyncio.Future[list[Reply]]]
    ) -> list[list[Reply] | PrqError]:
        """Wait for queued steps, each at most its retry budget (plus a socket timeout): time
        spent queued behind a stuck round trip counts, so no call outlives its budget."""
        results: list[list[Reply] | PrqError] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._step_deadline_s
        for future in futures:
            # one timer handle per step (asyncio.timeout costs several times that, per call):
            # past the deadline the step fails; not sent yet, it never will be (the batcher
            # skips what is done); in flight, its outcome is indeterminate
            timer = loop.call_at(deadline, self._overdue, future)
            try:
                results.append(await future)
            except PrqError as exc:
                results.append(exc)
            finally:
                timer.cancel()
        return results

    def _overdue(self, future: asyncio.Future[list[Reply]]) -> None:
        if not future.done():
            _fail_step(
                future,
                _unavailable(
                    RedisUnavailable("no round trip completed in time"),
                    self.settings.retry_budget_s,
                ),
            )

    async def execute_many(self, steps: Sequence[Sequence[Call]]) -> list[list[Reply] | PrqError]:
        """Send several independent steps in one batch; each gets its own replies or error."""
        if self._closed:
            raise _closed_error()
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[list[Reply]]] = []
        for calls in steps:
            future: asyncio.Future[list[Reply]] = loop.create_future()
            self._pending.append((calls, future))
            self._asked[future] = time.monotonic()
            futures.append(future)
        self._start_flusher()
        return await self._wait_steps(futures)

    def _start_flusher(self) -> None:
        if self._pending and self._in_flight < MAX_ROUND_TRIPS_IN_FLIGHT:
            self._in_flight += 1
            flusher = asyncio.ensure_future(self._flush())
            self._flushers.add(flusher)
            flusher.add_done_callback(self._flushers.discard)

    async def _flush(self) -> None:
        try:
            while self._pending:
                batch = self._pending[:DEFAULT_MAX_BATCH_STEPS]
                del self._pending[: len(batch)]
                for _, future in batch:
                    if future.done():
                        self._asked.pop(future, None)
                batch = [(calls, future) for calls, future in batch if not future.done()]
                if batch:
                    await self._send_batch(batch)
        finally:
            self._in_flight -= 1

    async def _send_batch(
        self, batch: list[tuple[Sequence[Call], asyncio.Future[list[Reply]]]]
    ) -> None:
        asked = [self._asked.pop(future, time.monotonic()) for _, future in batch]
        budgets = StepBudgets(
            [calls for calls, _ in batch],
            asked,
            self.settings.retry_budget_s,
            lambda i, result: _settle_step(batch[i][1], result),
        )
        try:
            await self._send(budgets)
        except BaseException as exc:  # never leave a waiting step behind
            budgets.give_up(exc if isinstance(exc, PrqError) else _closed_error(exc))
            if isinstance(exc, PrqError):
                return
            raise

    async def _send(self, budgets: StepBudgets) -> None:
        """One round trip for the steps, retried on connection errors while any step's budget
        lasts (see StepBudgets); every step is settled, unless another error is raised. On a
        cluster the retries go on in a task of their own, so that the batcher sends the steps
        for the other shards meanwhile (their round trips may overlap there)."""
        try:
            budgets.answered(await self._attempt(budgets.calls()))
            return
        except RedisUnavailable as exc:
            logger.debug("redis attempt failed, retrying error=%s", exc)
            budgets.failed(exc)
        if not budgets.live:
            return
        if self._overlapping:
            task = asyncio.ensure_future(self._retry_apart(budgets))
            self._retrying.add(task)
            task.add_done_callback(self._retrying.discard)
            return
        await self._retry(budgets)

    async def _retry_apart(self, budgets: StepBudgets) -> None:
        try:
            await self._retry(budgets)
        except BaseException as exc:  # never leave a waiting step behind
            budgets.give_up(exc if isinstance(exc, PrqError) else _closed_error(exc))
            if not isinstance(exc, PrqError | asyncio.CancelledError):
                raise

    async def _retry(self, budgets: StepBudgets) -> None:
        # The last attempt starts when the last budget ends and takes a socket timeout at most;
        # should the loop lag past that, the steps fail by the same deadline as a queued step's
        # (_wait_steps), half a second inside the documented bound (budget + socket timeout + 1 s)
        deadline_s = (
            max(0.0, budgets.remaining_s()) + self.redis_settings.socket_timeout_s + STEP_GRACE_S
        )
        try:
            async with asyncio.timeout(deadline_s):
                async for attempt in AsyncRetrying(**budgets.retrying()):
                    with attempt:
                        self.retries += 1
                        metrics.REDIS_RETRIES.inc()
                        budgets.answered(await self._attempt(budgets.calls()))
        except RedisUnavailable:
            assert not budgets.live  # each step was given up when its budget ran out
        except TimeoutError:
            budgets.give_up(
                _unavailable(RedisUnavailable("deadline passed"), self.settings.retry_budget_s)
            )

    async def _attempt(self, calls: Sequence[Call]) -> list[Reply]:
        # answers to one endpoint, and enqueues to one endpoint: one script call each
        sent, spread = merge_calls(calls)
        self.count(sent)
        replies = await self._raw(sent)
        if _needs_scripts(replies):
            await self.load_scripts()
            self.count(sent)
            replies = await self._raw(sent)
        return spread(replies)

    async def _raw(self, calls: Sequence[Call]) -> list[Reply]:
        """One round trip; error replies come back in place, transport errors raise."""
        try:
            with translate_errors():
                replies = await self._link.round_trip(calls)
        except RedisUnavailable as exc:
            if self.redis_settings.tls and tls_eof(exc):
                refused = await asyncio.to_thread(tls_probe, self.redis_settings)
                if refused is not None:
                    raise tls_configuration_error(refused) from exc
            self.reachability.failed(exc)
            raise
        self.reachability.answered()
        return replies

    async def load_scripts(self) -> None:
        """SCRIPT LOAD every prq script (after a restart or SCRIPT FLUSH)."""
        logger.info("loading prq scripts into Redis")
        for result in _split([script_load_calls()], await self._raw(script_load_calls())):
            if isinstance(result, PrqError):
                raise result

    async def aclose(self) -> None:
        """Fail waiting steps with QueueShutdown, stop the flusher, close the connections."""
        self._closed = True
        pending, self._pending = self._pending, []
        for _, future in pending:
            if not future.done():
                _fail_step(future, _closed_error())
        for flusher in list(self._flushers):
            flusher.cancel()
            with contextlib.suppress(BaseException):
                await flusher
        for task in list(self._retrying):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        await self._link.close()
        await aclose_client(self.client)
