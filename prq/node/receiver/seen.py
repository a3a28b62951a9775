"""Which sequence numbers a receiver has already run, so it can drop `at_least_once` redeliveries.

Stored as "highest seen + the gaps below it": the highest number seen, and the numbers below it
that were *not* seen, as disjoint, sorted, closed intervals `[start, end]`. Memory is one entry
per gap, not per number: seeing 1 and then 10**12 costs one interval. Lookups and updates are
O(log k) in the number of gaps k (bisect); filling a number shrinks or splits its gap.

Invariants: `floor <= start <= end < highest` for every gap; gaps are sorted, and any two are
separated by at least one seen number (never overlapping nor adjacent); at most `max_intervals`
gaps are kept; `gap_count` is the total size of the gaps.

Bound and the below-floor rule: when a new gap would exceed `max_intervals`, the lowest (oldest)
gaps are dropped and `floor` moves just above them; numbers below the floor are no longer
tracked. `add` returns True ("not seen, run it") for such a number and `n in seen` is False. A
duplicate run is allowed (handlers dedupe their side effects on the delivery hash); a lost
request is not. So the structure may forget that a number was seen, never that it was not:
`n in seen` implies n was added.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

__all__ = ["DEFAULT_MAX_INTERVALS", "SeenSequences"]

#: Default bound on the number of gap intervals kept.
DEFAULT_MAX_INTERVALS = 10_000
#: Version tag of `SeenSequences.to_state`; `from_state` rejects any other.
STATE_VERSION = 1
_STATE_KEYS = frozenset({"version", "max_intervals", "highest", "floor", "gaps"})


def _check_number(n: object, what: str) -> int:
    """`n` as a non-negative int, or ValueError (bool is not a number here)."""
    if type(n) is not int or n < 0:
        raise ValueError(f"{what} must be a non-negative int, got {n!r}")
    return n


class SeenSequences:
    """Sequence numbers seen so far: the highest, plus the missing numbers below it as gaps."""

    def __init__(self, max_intervals: int = DEFAULT_MAX_INTERVALS) -> None:
        self._max_intervals = _check_number(max_intervals, "max_intervals")
        self._highest: int | None = None
        self._floor = 0
        # Gap i is the closed interval [_starts[i], _ends[i]]; two lists so bisect works on starts.
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._gap_count = 0

    @property
    def highest(self) -> int | None:
        """The highest number seen, or None when nothing was seen yet."""
        return self._highest

    @property
    def floor(self) -> int:
        """Numbers below this are no longer tracked (0 until the bound first dropped a gap)."""
        return self._floor

    @property
    def max_intervals(self) -> int:
        """The most gap intervals kept before the lowest ones are dropped."""
        return self._max_intervals

    @property
    def gap_count(self) -> int:
        """How many numbers in `[floor, highest]` were not seen."""
        return self._gap_count

    @property
    def interval_count(self) -> int:
        """How many gap intervals are stored (at most `max_intervals`)."""
        return len(self._starts)

    def __contains__(self, n: object) -> bool:
        """True when `n` is known to have been seen; False if not, or if below the floor."""
        if type(n) is not int or n < self._floor or self._highest is None or n > self._highest:
            return False
        return self._gap_index(n) is None

    def __repr__(self) -> str:
        return (
            f"SeenSequences(highest={self._highest}, floor={self._floor}, "
            f"gaps={self.interval_count}, max_intervals={self._max_intervals})"
        )

    def add(self, n: int) -> bool:
        """Record `n`; True if it was not seen before (run it), False for a redelivery (drop it).

        A number below the floor is untracked: it returns True and records nothing (see the
        module docstring: a duplicate run is safe, a dropped request is not).
        """
        _check_number(n, "sequence number")
        if n < self._floor:
            return True
        if self._highest is None or n > self._highest:
            low = self._floor if self._highest is None else self._highest + 1
            self._highest = n
            if n > low:
                self._starts.append(low)
                self._ends.append(n - 1)
                self._gap_count += n - low
                self._trim()
            return True
        i = self._gap_index(n)
        if i is None:
            return False
        self._fill(i, n)
        return True

    def _gap_index(self, n: int) -> int | None:
        """Index of the gap holding `n`, or None when `n` is in no gap."""
        i = bisect_right(self._starts, n) - 1
        if i >= 0 and n <= self._ends[i]:
            return i
        return None

    def _fill(self, i: int, n: int) -> None:
        """Remove `n` from gap `i`: drop, shrink or split the gap."""
        start, end = self._starts[i], self._ends[i]
        self._gap_count -= 1
        if start == end:
            del self._starts[i], self._ends[i]
        elif n == start:
            self._starts[i] = n + 1
        elif n == end:
            self._ends[i] = n - 1
        else:
            self._ends[i] = n - 1
            self._starts.insert(i + 1, n + 1)
            self._ends.insert(i + 1, end)
            self._trim()

    def _trim(self) -> None:
        """Drop the lowest gaps beyond `max_intervals`; the floor moves just above them."""
        excess = len(self._starts) - self._max_intervals
        if excess <= 0:
            return
        dropped = zip(self._starts[:excess], self._ends[:excess], strict=True)
        self._gap_count -= sum(end - start + 1 for start, end in dropped)
        self._floor = self._ends[excess - 1] + 1
        del self._starts[:excess], self._ends[:excess]

    def to_state(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot (plain ints and lists) for `from_state` after a restart."""
        return {
            "version": STATE_VERSION,
            "max_intervals": self._max_intervals,
            "highest": self._highest,
            "floor": self._floor,
            "gaps": [[s, e] for s, e in zip(self._starts, self._ends, strict=True)],
        }

    @classmethod
    def from_state(cls, state: object) -> SeenSequences:
        """Rebuild from `to_state` output; ValueError naming the problem if `state` is malformed."""
        if not isinstance(state, dict) or set(state) != _STATE_KEYS:
            raise ValueError(f"state must be a dict with keys {sorted(_STATE_KEYS)}")
        if state["version"] != STATE_VERSION or type(state["version"]) is not int:
            raise ValueError(f"unsupported state version {state['version']!r}")
        seen = cls(_check_number(state["max_intervals"], "max_intervals"))
        highest, floor, gaps = state["highest"], state["floor"], state["gaps"]
        seen._floor = _check_number(floor, "floor")
        if not isinstance(gaps, list) or len(gaps) > seen._max_intervals:
            raise ValueError(f"gaps must be a list of at most max_intervals={seen._max_intervals}")
        if highest is None:
            if floor != 0 or gaps:
                raise ValueError("with highest None, floor must be 0 and gaps empty")
            return seen
        seen._highest = _check_number(highest, "highest")
        if floor > highest:
            raise ValueError(f"floor {floor} is above highest {highest}")
        prev_end = floor - 2  # the first gap may start at the floor
        for gap in gaps:
            if not isinstance(gap, list) or len(gap) != 2:
                raise ValueError(f"gap must be a [start, end] list, got {gap!r}")
            start, end = _check_number(gap[0], "gap start"), _check_number(gap[1], "gap end")
            if not prev_end + 1 < start <= end < highest:
                raise ValueError(
                    f"gap {gap!r} must satisfy floor <= start <= end < highest, sorted, "
                    "with a seen number between gaps (no overlap, not adjacent)"
                )
            seen._starts.append(start)
            seen._ends.append(end)
            seen._gap_count += end - start + 1
            prev_end = end
        return seen
