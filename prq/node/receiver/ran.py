"""What one receiver node ran of at_least_once requests, so it never runs a redelivery twice.

Per endpoint, the sequence numbers it ran (prq.node.receiver.seen: "highest seen + gaps"), and the
answers it gave, newest last and bounded, to answer a redelivery with the same answer. A sequence
number names one enqueue: numbers never repeat on an endpoint (scripts/_sequence.lua), not after its
counter expired nor after a data loss (what a rolled-back Redis numbers again lies behind the fence,
prq.node.data_loss, and is refused before it gets here). An answer is kept by request id, for the
latest run of that id only: an id sent again after its record expired is a new request, and a
redelivery of it must not get the answer of the earlier one. Thread-safe (the blocking facade adopts
requests from several serve threads).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from prq.node.receiver.seen import SeenSequences

__all__ = ["DEFAULT_RAN_RESPONSES", "RanRequests"]

#: How many answers of at_least_once requests a node keeps, to answer a redelivery of one it
#: ran with the same answer.
DEFAULT_RAN_RESPONSES = 10_000


class RanRequests:
    """The at_least_once requests one node ran, and their answers."""

    def __init__(self, max_responses: int = DEFAULT_RAN_RESPONSES) -> None:
        self._lock = threading.Lock()
        #: endpoint -> the sequence numbers run there
        self._sequences: dict[str, SeenSequences] = {}
        self._responses: OrderedDict[str, bytes] = OrderedDict()
        self._max_responses = max_responses

    def first_run(self, endpoint: str, sequence: int, request_id: str, attempt: int) -> bool:
        """Remember that a request runs here; False if this node ran (or runs) it before: a
        redelivery (attempt 2 or later), not to be run again."""
        with self._lock:
            if sequence <= 0:
                return True
            seen = self._sequences.get(endpoint)
            if seen is None:
                seen = self._sequences[endpoint] = SeenSequences()
            first = seen.add(sequence)
            if first:
                self._responses.pop(request_id, None)  # an earlier request's, under the same id
            return first or attempt <= 1  # a first attempt is never a redelivery

    def remember(self, request_id: str, response: bytes) -> None:
        """Keep the answer given to a request (the oldest beyond the bound are dropped)."""
        with self._lock:
            self._responses[request_id] = response
            while len(self._responses) > self._max_responses:
                self._responses.popitem(last=False)

    def response(self, request_id: str) -> bytes | None:
        """The answer kept for a request, if any."""
        with self._lock:
            return self._responses.get(request_id)
