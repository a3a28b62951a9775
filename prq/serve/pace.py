"""The serve loops' timing: how long their handlers take (_Pace, which decides whether a loop
takes ahead of its handlers), and how long a loop backs off after a failed take.
"""

from __future__ import annotations

import logging

from prq.core.defaults import SERVE_BACKOFF_MAX_S
from prq.core.errors import PrqError
from prq.core.jitter import jitter

logger = logging.getLogger("prq.serve.worker")  # (the serve loops log under one name)

#: An asyncio serve loop takes ahead of its handlers only while their runs take less than this
#: on average (see _Pace), and weighs each new run so much in that average.
TAKE_AHEAD_BELOW_S = 0.005
PACE_WEIGHT = 0.1


def _backoff_s(failures: int) -> float:
    """The pause after `failures` failed takes in a row: at most SERVE_BACKOFF_MAX_S, which
    a take receipt outlives (QueueSettings.take_retry_s)."""
    return float(min(SERVE_BACKOFF_MAX_S, 0.1 * 2 ** min(failures, 8)) * jitter())


def _log_failure(endpoint: str, exc: PrqError, failures: int) -> int:
    failures += 1
    level = logging.WARNING if failures == 1 else logging.DEBUG
    logger.log(level, "dequeue failed endpoint=%r error=%s failures=%d", endpoint, exc, failures)
    return failures


class _Pace:
    """How long a serve loop's handlers have been taking: an exponentially weighted mean of
    their runs. Taking ahead pays only while they are quick; a slow handler must not sit on
    requests that another receiver could run."""

    __slots__ = ("mean_s",)

    def __init__(self) -> None:
        self.mean_s: float | None = None

    def ran(self, seconds: float) -> None:
        mean = self.mean_s
        self.mean_s = seconds if mean is None else mean + PACE_WEIGHT * (seconds - mean)

    @property
    def quick(self) -> bool:
        return self.mean_s is not None and self.mean_s < TAKE_AHEAD_BELOW_S
