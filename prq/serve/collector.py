"""The cyclic garbage collector's pace in processes that serve prq.

A receiver makes and drops a few dozen container objects per request (the request, its models,
futures, the steps of its answer). At CPython's default first threshold (700 allocations) the
collector runs every few requests, and what is alive at that moment (the requests taken but not
yet answered) is promoted and later scanned again by full collections: a fifth of an asyncio
receiver's CPU when it drains a backlog. Nearly all of these objects are freed by reference
counting anyway; collecting less often lets them die young.

`prq worker` calls `relax_collector()` at start. A process that serves with the library's own
facades can do the same (or call `gc.set_threshold` itself): it is process-wide, so prq never
does it behind a caller's back.
"""

from __future__ import annotations

import gc

__all__ = ["FIRST_THRESHOLD", "relax_collector"]

#: Allocations (net) between two young-generation collections; CPython's default is 700.
FIRST_THRESHOLD = 10_000


def relax_collector(first_threshold: int = FIRST_THRESHOLD) -> None:
    """Collect the young generation every `first_threshold` allocations (never more often
    than now); the older generations' thresholds are kept."""
    first, *older = gc.get_threshold()
    if 0 < first < first_threshold:
        gc.set_threshold(first_threshold, *older)
