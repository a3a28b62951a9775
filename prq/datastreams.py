"""Large bodies beside Redis: the store protocol.

Only the interface exists in this version: a queue given a store refuses to start (see
`QueueBase`), and every body up to `max_body_bytes` is kept inline in Redis.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["DataStreamStore"]


class DataStreamStore(Protocol):
    """Where bodies over `inline_limit_bytes` go; Redis keeps only a reference."""

    def store(self, stream_id: str, data: bytes) -> str:
        """Keep `data`; return the reference that Redis will hold."""
        ...

    def rehydrate(self, reference: str) -> bytes:
        """Read the data back (at most once)."""
        ...

    def delete(self, reference: str) -> None:
        """Remove the data (after use, or when its TTL passed)."""
        ...
