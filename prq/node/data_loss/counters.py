"""What a node knows of each endpoint's enqueue counter (prq.node.data_loss): the highest value
it saw (its floor), whether it vouches for the counter, the counter's life, and how far the
ghosts of a declared loss go; and whether a reading of the counter went back.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from prq.node.data_loss.scopes import LossScopes

__all__ = ["EnqueueCounters", "Floor", "learn_ghosts"]


@dataclass(frozen=True, slots=True)
class Floor:
    """What an enqueue counter must not be below when a reading sent now comes back: the
    value, in which life of the counter, and in which epoch of the node."""

    value: int
    life: int
    epoch: int


@dataclass(slots=True)
class _Counter:
    """What a node knows of one endpoint's enqueue counter."""

    life: int
    #: When this node last used the endpoint (monotonic).
    used: float
    floor: int = 0
    #: Until when (monotonic) the counter surely lives, but for a loss; None: not vouched for.
    vouched_until: float | None = None
    #: Sequence numbers up to this one are ghosts (0: none): requests queued before a loss
    #: that the Redis which lost data may hand out again, though they may have run already.
    ghosts_up_to: int = 0
    #: A loss was declared and no reading of the counter sent after it came back since: the
    #: first one (a take's, a check's) sets `ghosts_up_to`, as everything queued then came
    #: before it.
    ghost_reading_due: bool = False
    #: The node's epoch from that declaration on: a reading sent in an earlier epoch (before
    #: the declaration) may show the counter before the loss, above what the Redis that lost
    #: data numbered since, so it would count requests queued after the loss as ghosts.
    ghost_epoch: int = 0


def learn_ghosts(counter: _Counter, value: int, sent_epoch: int) -> None:
    """A reading of the counter sent in epoch `sent_epoch` came back: the first sent since a
    declaration tells how far the ghosts go (the counter is then at least at every ghost's
    number: the Redis that lost data numbered them all before the reading)."""
    if counter.ghost_reading_due and sent_epoch >= counter.ghost_epoch:
        counter.ghosts_up_to = max(counter.ghosts_up_to, value)
        counter.ghost_reading_due = False


class EnqueueCounters(LossScopes):
    """One node's remembered enqueue counters (a mixin of `DataLossWatch`)."""

    _counters: dict[str, _Counter]
    _lives: itertools.count[int]

    def floor(self, endpoint: str, now: float) -> Floor | None:
        """The floor a reading of `endpoint`'s counter sent now is judged against (None: not
        vouched for, the reading cannot tell a loss); a use of the endpoint."""
        with self._lock:
            return self._floor(endpoint, self._counter(endpoint, now, used=True))

    def read(
        self, endpoint: str, floor: Floor | None, value: int, now: float, sent_epoch: int
    ) -> str | None:
        """A reading of the counter (a take's), sent when `floor` was had and the node's epoch
        was `sent_epoch`: why it shows data loss, or None (the value is then learned)."""
        with self._lock:
            counter = self._counter(endpoint, now, used=True)
            reason = self._went_back(endpoint, counter, floor, value)
            if not reason:
                self._raise_floor(endpoint, counter, value, sent_epoch)
                learn_ghosts(counter, value, sent_epoch)
            return reason

    def ghosts_up_to(self, endpoint: str) -> int:
        """Requests handed out with a sequence number up to this one (and above 0: a
        hand-off's is not known) were queued before a loss this node declared, in this life of
        the counter: the Redis that lost data may hand them out though they ran already, so
        they must not run (at most once). 0: none."""
        with self._lock:
            counter = self._counters.get(endpoint)
            return 0 if counter is None else counter.ghosts_up_to

    def ghosts_for_take(self, endpoint: str, counter: int | None) -> int:
        """ghosts_up_to for the items of a take whose reading of the counter was `counter`
        (None: it read none): while no reading sent after a declaration has come back, that
        take's own reading bounds the ghosts it may hold (kept for that take alone: sent
        before the declaration, it may show the counter before the loss)."""
        with self._lock:
            known = self._counters.get(endpoint)
            if known is None:
                return 0
            if known.ghost_reading_due and counter is not None:
                return max(known.ghosts_up_to, counter)
            return known.ghosts_up_to

    def observe(self, endpoint: str, value: int, now: float, sent_epoch: int) -> None:
        """Note an endpoint's counter as this node's own enqueue, sent when the node's epoch was
        `sent_epoch`, reported it: the highest value seen is kept; a use of the endpoint. (An
        enqueue's reading sets no ghost mark: the enqueue's own requests are numbered up to
        it.)"""
        with self._lock:
            counter = self._counter(endpoint, now, used=True)
            self._raise_floor(endpoint, counter, value, sent_epoch)

    def _raise_floor(self, endpoint: str, counter: _Counter, value: int, sent_epoch: int) -> None:
        """Learn a reading sent in epoch `sent_epoch` as the floor, unless a declaration that
        covers the endpoint came since it was sent: it may show the Redis from before the
        loss (a counter since started again), and a floor from it would make the next check
        declare the same loss a second time. Call with the lock held."""
        if sent_epoch >= self.epoch_of(endpoint):
            counter.floor = max(counter.floor, value)

    def life(self, endpoint: str, now: float) -> int:
        """The endpoint's counter's life now: sequence numbers seen in another life may belong
        to other requests (module docstring)."""
        with self._lock:
            return self._counter(endpoint, now, used=True).life

    def _counter(self, endpoint: str, now: float, *, used: bool = False) -> _Counter:
        """What is known of `endpoint`'s counter at `now` (a new life if its vouching lapsed);
        call with the lock held."""
        counter = self._counters.get(endpoint)
        if counter is None:
            counter = self._counters[endpoint] = _Counter(next(self._lives), now)
            self.next_check = now  # refresh it, and vouch for it, at once
            self.wake()
        elif counter.vouched_until is not None and now >= counter.vouched_until:
            # Not refreshed for as long as vouched: it may have expired and started again.
            counter.life = next(self._lives)
            counter.floor = 0
            counter.vouched_until = None
            counter.ghosts_up_to, counter.ghost_reading_due = 0, False  # (numbers start again)
        if used:
            counter.used = max(counter.used, now)
        return counter

    def _floor(self, endpoint: str, counter: _Counter) -> Floor | None:
        if counter.vouched_until is None:
            return None
        return Floor(counter.floor, counter.life, self.epoch_of(endpoint))

    def _went_back(
        self, endpoint: str, counter: _Counter, floor: Floor | None, value: int
    ) -> str | None:
        """Why a reading below `floor` is data loss, if it is: the floor was vouched for when
        the reading was sent, and neither a new life nor a declaration came since."""
        if floor is None or floor.life != counter.life or floor.epoch != self.epoch_of(endpoint):
            return None
        if value < floor.value:
            return f"enqueue counter of {endpoint!r} went back from {floor.value} to {value}"
        return None
