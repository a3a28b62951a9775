"""Batches: what both batchers (prq.transport.async_io, prq.transport.sync_io) share about the
steps one round trip carries: the bound on a batch, a batch's replies cut back into one outcome
per step, the NOSCRIPT check that has the scripts loaded again, and the counts of commands and
round trips.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.exceptions import NoScriptError

from prq.core.errors import PrqError
from prq.protocol.effects import Call, Reply
from prq.transport.translate import _reply_error

__all__ = ["DEFAULT_MAX_BATCH_STEPS", "MAX_ROUND_TRIPS_IN_FLIGHT", "IOCounters", "Outcome"]


#: Most steps one batched round trip carries (bounds the size of one pipeline).
DEFAULT_MAX_BATCH_STEPS = 512

#: Round trips an asyncio node keeps in flight on its link (pipelined: Redis runs one batch
#: while the node reads and acts on the other); a blocking node on a cluster lets as many
#: threads lead a batch at once (prq.transport.sync_io).
MAX_ROUND_TRIPS_IN_FLIGHT = 2

#: What a step ends with: its replies, or the error that ended it.
Outcome = list[Reply] | PrqError


class IOCounters:
    """Client-side counts, for tests and metrics: commands sent and round trips made."""

    def __init__(self) -> None:
        self.commands = 0
        self.round_trips = 0
        self.retries = 0

    def count(self, calls: Sequence[Call]) -> None:
        self.commands += len(calls)
        self.round_trips += 1


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


def _needs_scripts(replies: list[Reply]) -> bool:
    return any(isinstance(reply, NoScriptError) for reply in replies)
