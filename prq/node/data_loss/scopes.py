"""Where a data loss is and how far back it reaches (prq.node.data_loss, first part): each
slot's mark (the epoch and fence of the last declaration that covered it), the scope (slots) of
a master, and the canary the node keeps on every master.

`LossScopes` types the watch's shared state (built by `DataLossWatch.__init__`) and answers
which mark an endpoint is under and which slots a loss covers; the other mixins (counters,
checks) build on it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from redis.crc import key_slot

from prq.protocol.flows.context import Context
from prq.protocol.scripts.liveness import fresh_canary

logger = logging.getLogger(__name__)

__all__ = [
    "CANARY_SEARCH_LIMIT",
    "CANARY_TTL_CHECKS",
    "Canary",
    "Layout",
    "Loss",
    "LossScopes",
    "Mark",
]

#: A cluster's masters and the slots each serves (prq.transport.connectors.shard_layout); None: one
#: server.
Layout = dict[str, list[int]] | None

#: A canary lives this many check intervals (plus the retry budget) without a check.
CANARY_TTL_CHECKS = 3
#: How many key names a search for a canary on a given master tries before giving up on it.
CANARY_SEARCH_LIMIT = 200_000


@dataclass(slots=True)
class Canary:
    """One canary: the value the node expects it to hold (None: not known, write one at the
    next check; 0: none), the value its next step writes (`last` + 1; a fresh one at random
    after a surprise, so that no value repeats: canary.lua), and the server's clock (µs) at the
    step that read `last`."""

    last: int | None = None
    following: int = field(default_factory=fresh_canary)
    good: int = 0

    def read(self, value: int, clock: int, surprise: bool) -> None:
        """A step read `value` at `clock`; the next one steps on from it."""
        self.last, self.good = value, clock
        self.following = fresh_canary() if surprise else value + 1


@dataclass(frozen=True, slots=True)
class Mark:
    """The last declaration that covered a slot: its number, and the fence (a server time,
    µs): requests numbered at or below it were queued before a loss there."""

    epoch: int = 0
    fence: int = 0


NO_MARK = Mark()


@dataclass(frozen=True, slots=True)
class Loss:
    """A sign of data loss: why, which slots it covers (None: all of Redis), and the fence it
    sets (a server time before the loss, µs; module docstring of prq.node.data_loss)."""

    reason: str
    slots: frozenset[int] | None = None
    fence: int = 0
    #: Shown by a canary, which steps on from what it read. Any other sign leaves the
    #: canaries there as they were before the loss: they are written afresh at the next check,
    #: which comes at once (else that check would show the same loss a second time).
    by_canary: bool = False


class LossScopes:
    """One node's epochs by slot and canaries by master (a mixin of `DataLossWatch`)."""

    ctx: Context
    #: The cluster's layout as the client knows it now (None: one server).
    layout: Callable[[], Layout]
    canary_key: str
    #: Each canary by key, oldest first.
    canaries: dict[str, Canary]
    #: The number of the last declaration.
    epoch: int
    #: The mark of a declaration for all of Redis (one server), and of those for some slots
    #: (a cluster's masters): a slot is under the later epoch and the higher fence of both.
    _everywhere: Mark
    _slot_marks: dict[int, Mark]
    _slots: dict[str, int]
    events: int
    next_check: float
    #: Called when an endpoint is new to the node: its check is due at once (set by the
    #: node's watch, which wakes its loop).
    wake: Callable[[], None]
    _lock: threading.Lock

    def canary_ttl_s(self) -> float:
        """A canary outlives a few missed checks and a Redis pause within the retry budget."""
        settings = self.ctx.settings
        return (
            CANARY_TTL_CHECKS * settings.data_loss_check_interval_s + settings.retry_budget_s + 1.0
        )

    @property
    def canary(self) -> int | None:
        """The value the first canary read last (the node's only one on one server)."""
        canary = self.canaries.get(self.canary_key)
        return None if canary is None else canary.last

    def mark_of(self, endpoint: str) -> Mark:
        """The mark `endpoint` is under: the last declaration that covered its slot."""
        if not self._slot_marks:
            return self._everywhere
        slot = self._slot_marks.get(self._slot(endpoint), NO_MARK)
        everywhere = self._everywhere
        return Mark(max(everywhere.epoch, slot.epoch), max(everywhere.fence, slot.fence))

    def epoch_of(self, endpoint: str) -> int:
        """The epoch of `endpoint`: that of the last declaration that covered its slot."""
        return self.mark_of(endpoint).epoch

    def fence_of(self, endpoint: str) -> int:
        """Requests of `endpoint` numbered at or below this were queued before a loss this
        node declared there (ghosts); 0: none."""
        return self.mark_of(endpoint).fence

    def _raise_fence(self, slots: frozenset[int] | None, fence: int) -> None:
        """Raise the fence in `slots` (None: everywhere) to `fence`, in the epoch they are
        in: a sign of a loss declared there since it was sent, which bounds that loss's
        ghosts higher. Call with the lock held."""
        if slots is None:
            self._everywhere = Mark(self._everywhere.epoch, max(self._everywhere.fence, fence))
            return
        for slot in slots:
            mark = self._slot_marks.get(slot, NO_MARK)
            self._slot_marks[slot] = Mark(mark.epoch, max(mark.fence, fence))

    def scope_of(self, endpoint: str) -> frozenset[int] | None:
        """The slots of the master that serves `endpoint` now (None: one server, all)."""
        layout = self.layout()
        if layout is None:
            return None
        slot = self._slot(endpoint)
        for slots in layout.values():
            if slot in slots:
                return frozenset(slots)
        return frozenset((slot,))

    def covers(self, endpoint: str, slots: frozenset[int] | None) -> bool:
        return slots is None or self._slot(endpoint) in slots

    def _slot(self, endpoint: str) -> int:
        slot = self._slots.get(endpoint)
        if slot is None:
            slot = key_slot(self.ctx.keys.endpoint(endpoint).sequence.encode())
            if len(self._slots) < 100_000:
                self._slots[endpoint] = slot
        return slot

    def _scope_of_key(self, key: str) -> frozenset[int] | None:
        layout = self.layout()
        if layout is None:
            return None
        slot = key_slot(key.encode())
        for slots in layout.values():
            if slot in slots:
                return frozenset(slots)
        return frozenset((slot,))

    def _place_canaries(self, layout: Layout) -> None:
        """Keep one canary on every master of `layout`: the oldest one a master still serves
        stays, a master without one gets a fresh key; call with the lock held."""
        if not layout:  # one server, or a cluster client that has not read its layout yet
            return
        owner = {slot: master for master, slots in layout.items() for slot in slots}
        placed: dict[str, str] = {}
        for key in self.canaries:
            master = owner.get(key_slot(key.encode()))
            if master is not None and master not in placed:
                placed[master] = key
        for master in layout:
            if master not in placed:
                fresh = self._canary_on(owner, master)
                if fresh is not None:
                    placed[master] = fresh
        kept = set(placed.values())
        self.canaries = {key: c for key, c in self.canaries.items() if key in kept}
        for key in placed.values():
            self.canaries.setdefault(key, Canary())

    def _canary_on(self, owner: dict[int, str], master: str) -> str | None:
        for n in range(CANARY_SEARCH_LIMIT):
            key = self.ctx.keys.canary(self.ctx.node_id, n)
            if owner.get(key_slot(key.encode())) == master:
                return key
        logger.warning("no canary key found for master=%s", master)
        return None
