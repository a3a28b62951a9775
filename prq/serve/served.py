"""What a serve loop needs of the queue it serves: AsyncServedQueue (the asyncio loop's, which
AsyncQueue is) and BlockingServedQueue (the threads' loop's, which Queue is).

The facades satisfy these structurally: serve is the layer below them and must not import them.
Only the members the loops use are listed (taking, building and writing answers, the set of
requests being served, and whether the queue is closing).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from prq.core.config import QueueSettings
from prq.core.errors import PrqError
from prq.core.lifecycle import PendingRequest
from prq.core.models import Response


class AsyncServedQueue(Protocol):
    """The queue an asyncio serve loop takes from and answers through (AsyncQueue)."""

    settings: QueueSettings
    node_id: str
    #: The ids of the requests this node runs or answers: kept while held, for the closing.
    _serving: set[str]

    @property
    def closed(self) -> bool: ...

    async def _take(
        self,
        endpoint: str,
        max_items: int,
        timeout_s: float,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[PendingRequest]: ...

    async def _answer_body(self, response: Response) -> tuple[bytes | None, PrqError | None]: ...

    async def _write_answers(self, answers: Sequence[tuple[str, bytes]]) -> dict[str, PrqError]: ...


class BlockingServedQueue(Protocol):
    """The queue a blocking serve loop's threads take from and answer through (Queue)."""

    settings: QueueSettings
    node_id: str
    #: The ids of the requests this node runs or answers: kept while held, for the closing.
    _serving: set[str]

    @property
    def closed(self) -> bool: ...

    def _take(
        self,
        endpoint: str,
        max_items: int,
        timeout_s: float,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[PendingRequest]: ...

    def _answer_body(self, response: Response) -> tuple[bytes | None, PrqError | None]: ...

    def _write_answers(self, answers: Sequence[tuple[str, bytes]]) -> dict[str, PrqError]: ...
