"""What one receiver node took lately, so it never runs what a rolled-back Redis hands out again.

A hand-out is known by the request's sequence number on its endpoint ("sq", the endpoint's
enqueue counter when the request was enqueued; take.lua returns it): fresh for every enqueue,
so a request id sent again after its record expired (a deterministic id re-run, a dead letter
replayed) is a new request, not a second delivery. Within one life of the counter
(prq.node.data_loss) a sequence number names one enqueue; a hand-out of the same one at the same or
an earlier attempt can only come from a Redis that went back in time.

What a node took before it declared data loss is kept: the rolled-back Redis may hand it out
again, and it must not run twice. But a rolled-back counter hands the same sequence numbers to
new requests, so a remembered hand-out matches only the same request id; and one that matches
from before the declaration is refused without declaring again (the loss was told already).
A new life forgets the endpoint's hand-outs: its sequence numbers start again.

Bounded (the oldest hand-outs are forgotten first: a very old one handed out again then runs,
unless the counter shows the rollback first) and thread-safe (the blocking facade takes from
several serve threads).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

__all__ = ["DEFAULT_TAKEN_MEMORY", "TakenRequests", "Verdict"]

#: How many hand-outs a node remembers.
DEFAULT_TAKEN_MEMORY = 100_000

#: "first": run it; "again": handed out a second time in this epoch (a rollback the counter
#: did not show: declare data loss); "again_after_loss": handed out again by the Redis this node
#: declared lost (refuse it, the loss was declared already).
Verdict = Literal["first", "again", "again_after_loss"]


# (not frozen: a frozen dataclass costs 3.5 times as much to build, one per request taken)
@dataclass(slots=True)
class _Taken:
    request_id: str
    attempt: int
    life: int
    epoch: int


class TakenRequests:
    """The hand-outs one node took: (endpoint, sequence number) → request id and attempt."""

    def __init__(self, max_items: int = DEFAULT_TAKEN_MEMORY) -> None:
        self._lock = threading.Lock()
        self._taken: OrderedDict[tuple[str, int], _Taken] = OrderedDict()
        self._max_items = max_items

    def take(
        self, endpoint: str, sequence: int, request_id: str, attempt: int, life: int, epoch: int
    ) -> Verdict:
        """Remember a hand-out of the counter's `life`, taken in the node's `epoch`; whether it
        was handed to this node before. A sequence number of 0 (unknown) cannot be judged."""
        if sequence <= 0:
            return "first"
        key = (endpoint, sequence)
        with self._lock:
            before = self._taken.get(key)
            if (
                before is not None
                and before.life == life
                and before.request_id == request_id
                and attempt <= before.attempt
            ):
                return "again" if before.epoch == epoch else "again_after_loss"
            self._taken[key] = _Taken(request_id, attempt, life, epoch)
            self._taken.move_to_end(key)
            while len(self._taken) > self._max_items:
                self._taken.popitem(last=False)
            return "first"
