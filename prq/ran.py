"""What one receiver node ran of at_least_once requests, so it never runs a redelivery twice.

Per endpoint, the sequence numbers it ran (prq.seen: "highest seen + gaps"), and the answers it
gave, newest last and bounded, to answer a redelivery with the same answer. Everything is
forgotten when the node declares that Redis lost data: sequence numbers start again then.
Thread-safe (the blocking facade adopts requests from several serve threads).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from prq.seen import SeenSequences

__all__ = ["DEFAULT_RAN_RESPONSES", "RanRequests"]

#: How many answers of at_least_once requests a node keeps, to answer a redelivery of one it
#: ran with the same answer.
DEFAULT_RAN_RESPONSES = 10_000


class RanRequests:
    """The at_least_once requests one node ran, and their answers."""

    def __init__(self, max_responses: int = DEFAULT_RAN_RESPONSES) -> None:
        self._lock = threading.Lock()
        self._sequences: dict[str, SeenSequences] = {}
        self._responses: OrderedDict[str, bytes] = OrderedDict()
        self._max_responses = max_responses
        self._epoch = 0

    def first_run(self, endpoint: str, sequence: int, attempt: int, epoch: int) -> bool:
        """Remember that a request runs here; False if this node ran (or runs) it before: a
        redelivery (attempt 2 or later), not to be run again. `epoch` counts the node's data
        loss declarations: a new one forgets everything."""
        with self._lock:
            if epoch != self._epoch:
                self._sequences.clear()  # Redis lost data: its sequence numbers start again
                self._responses.clear()
                self._epoch = epoch
            if sequence <= 0:
                return True
            first = self._sequences.setdefault(endpoint, SeenSequences()).add(sequence)
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
