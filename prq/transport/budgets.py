"""The one retry policy: each step of a round trip keeps its own retry budget (`StepBudgets`).

Connection-class errors (`RedisUnavailable`, see prq.transport.translate) are retried with
exponential backoff and full jitter (prq.core.jitter) until `QueueSettings.retry_budget_s` has
passed since the step was asked for, then surface as `QueueUnavailable`: never sooner (the last
back-off is cut short so that one more attempt is made when the budget ends), and no later than
one attempt after it. Every prq write is idempotent when replayed, which is what makes
retrying writes safe. Both batchers drive this policy through tenacity (`retrying()`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    MovedError,
    SlotNotCoveredError,
    TryAgainError,
)
from tenacity import RetryCallState, before_sleep_log, retry_if_exception_type

from prq.core.errors import PrqError
from prq.core.jitter import wait_jittered_exponential
from prq.protocol.effects import Call, Reply, attempt_calls
from prq.transport.batches import Outcome, _split
from prq.transport.translate import RedisUnavailable, _unavailable

logger = logging.getLogger(__name__)

__all__ = ["STEP_GRACE_S", "StepBudgets"]


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

#: A step gives up this long after its retry budget and one socket timeout: the documented bound
#: for QueueUnavailable is budget + socket timeout + 1 s, and this leaves room for scheduling.
STEP_GRACE_S = 0.5


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
        """The calls of the steps still tried, for the next attempt (a call sent before goes
        as its resend: prq.protocol.effects.attempt_calls)."""
        return attempt_calls(call for i in self.live for call in self.steps[i])

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
