"""Where a data loss is: the epoch of each slot, the scope (slots) of a master, and the canary
the node keeps on every master (prq.node.data_loss, last part).

`LossScopes` types the watch's shared state (built by `DataLossWatch.__init__`) and answers
which epoch an endpoint is in and which slots a loss covers; the other mixins (counters, checks)
build on it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from redis.crc import key_slot

from prq.protocol.flows.context import Context

logger = logging.getLogger(__name__)

__all__ = ["CANARY_SEARCH_LIMIT", "CANARY_TTL_CHECKS", "Layout", "LossScopes"]

#: A cluster's masters and the slots each serves (prq.transport.connectors.shard_layout); None: one
#: server.
Layout = dict[str, list[int]] | None

#: A canary lives this many check intervals (plus the retry budget) without a check.
CANARY_TTL_CHECKS = 3
#: How many key names a search for a canary on a given master tries before giving up on it.
CANARY_SEARCH_LIMIT = 200_000


class LossScopes:
    """One node's epochs by slot and canaries by master (a mixin of `DataLossWatch`)."""

    ctx: Context
    #: The cluster's layout as the client knows it now (None: one server).
    layout: Callable[[], Layout]
    canary_key: str
    #: Each canary's key -> the value it read last (None: write a fresh one), oldest first.
    canaries: dict[str, int | None]
    #: The number of the last declaration; the epoch of a slot is that of the last one
    #: whose scope held it.
    epoch: int
    _everywhere: int
    _slot_epochs: dict[int, int]
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
        return self.canaries.get(self.canary_key)

    def epoch_of(self, endpoint: str) -> int:
        """The epoch of `endpoint`: that of the last declaration that covered its slot."""
        if not self._slot_epochs:
            return self._everywhere
        return max(self._everywhere, self._slot_epochs.get(self._slot(endpoint), 0))

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
        self.canaries = {key: last for key, last in self.canaries.items() if key in kept}
        for key in placed.values():
            self.canaries.setdefault(key, None)

    def _canary_on(self, owner: dict[int, str], master: str) -> str | None:
        for n in range(CANARY_SEARCH_LIMIT):
            key = self.ctx.keys.canary(self.ctx.node_id, n)
            if owner.get(key_slot(key.encode())) == master:
                return key
        logger.warning("no canary key found for master=%s", master)
        return None
