"""What one receiver node took lately, so it never runs what a rolled-back Redis hands out again.

A hand-out is known by the request's sequence number on its endpoint ("sq", take.lua returns
it) and its id. Sequence numbers never repeat on an endpoint (scripts/_sequence.lua: each is at
least the server's clock in microseconds, above every earlier one), so a request id sent again
after its record expired (a deterministic id re-run, a dead letter replayed) is a new request
with a new number, not a second delivery; and a hand-out of the same number and id at the same
or an earlier attempt can only come from a Redis that went back in time, which no reading of
its numbers showed (prq.node.data_loss: the taker declares the loss), unless it is a reply that
came late: an earlier attempt got by an earlier take of this node, whose reply reached it after
the reply of a later take that got the request again (two connections, or a reply held).

Bounded (the oldest hand-outs are forgotten first: a very old one handed out again then runs,
unless a reading or a fence shows the rollback first) and thread-safe (the blocking facade takes
from several serve threads).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

__all__ = ["DEFAULT_TAKEN_MEMORY", "TakenRequests", "Verdict"]

#: How many hand-outs a node remembers.
DEFAULT_TAKEN_MEMORY = 100_000


# (not frozen: a frozen dataclass costs 3.5 times as much to build, one per request taken)
#: What a hand-out is to the node that takes it (TakenRequests.take)
Verdict = Literal["first", "again", "late"]


@dataclass(slots=True)
class _Taken:
    request_id: str
    attempt: int
    #: the order of the take that got it among this node's takes (0: unknown)
    serial: int


class TakenRequests:
    """The hand-outs one node took: (endpoint, sequence number) → request id and attempt."""

    def __init__(self, max_items: int = DEFAULT_TAKEN_MEMORY) -> None:
        self._lock = threading.Lock()
        self._taken: OrderedDict[tuple[str, int], _Taken] = OrderedDict()
        self._max_items = max_items

    def take(
        self, endpoint: str, sequence: int, request_id: str, attempt: int, serial: int = 0
    ) -> Verdict:
        """Remember a hand-out; what it is: "first" (not handed to this node before), "again"
        (handed to it before: the same number and id, an attempt not later), or "late" (an
        earlier attempt, got by a take this node sent before the take that got the later one,
        whose reply came after it: Redis handed it out in that order, and the earlier owner
        token has lost the request; nothing is remembered). `serial` orders this node's
        takes by their sending (0: unknown, never late). A sequence number of 0 (unknown)
        cannot be judged."""
        if sequence <= 0:
            return "first"
        key = (endpoint, sequence)
        with self._lock:
            before = self._taken.get(key)
            if before is not None and before.request_id == request_id:
                if attempt < before.attempt and 0 < serial < before.serial:
                    return "late"
                if attempt <= before.attempt:
                    return "again"
            self._taken[key] = _Taken(request_id, attempt, serial)
            self._taken.move_to_end(key)
            while len(self._taken) > self._max_items:
                self._taken.popitem(last=False)
            return "first"

    def forget(self, endpoint: str, sequence: int, request_id: str) -> None:
        """Forget a hand-out given back unrun (a take cut short: unpark.lua), which may be
        handed out again, to this node too, at the same attempt."""
        with self._lock:
            before = self._taken.get((endpoint, sequence))
            if before is not None and before.request_id == request_id:
                del self._taken[(endpoint, sequence)]
