"""Backoff jitter drawn from a generator of prq's own, never from the `random` module's shared
one: a node's background threads back off while its process runs, and drawing from the shared
generator would move the sequence an application (or a property-based test) seeded."""

from __future__ import annotations

import random

from tenacity import RetryCallState
from tenacity.wait import wait_exponential

__all__ = ["jitter", "wait_jittered_exponential"]

#: prq's own generator (jitter is no secret: the Mersenne Twister is enough).
_RANDOM = random.Random()  # noqa: S311


def jitter() -> float:
    """A factor in [0, 1) to spread backoffs out."""
    return _RANDOM.random()


class wait_jittered_exponential(wait_exponential):
    """tenacity's `wait_random_exponential` (a wait drawn between `min` and the exponential
    bound), drawn from prq's own generator."""

    def __call__(self, retry_state: RetryCallState) -> float:
        high = super().__call__(retry_state=retry_state)
        return _RANDOM.uniform(self.min, high)
