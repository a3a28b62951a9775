"""One node's data-loss watch (prq.node.data_loss): its canaries and remembered enqueue
counters at start, and declaring a loss (a new epoch where it happened).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping

from redis.crc import key_slot

from prq.node.data_loss.checks import LossChecks
from prq.node.data_loss.counters import learn_ghosts
from prq.node.data_loss.scopes import Layout
from prq.observe import metrics
from prq.protocol.flows.context import Context

logger = logging.getLogger(__name__)

__all__ = ["DataLossWatch"]


class DataLossWatch(LossChecks):
    """One node's canary and remembered enqueue counters."""

    def __init__(self, ctx: Context, layout: Callable[[], Layout] = lambda: None) -> None:
        """Build the watch's state: each part is typed, and described, where it is declared
        (scopes, counters, checks)."""
        self.ctx = ctx
        self.layout = layout
        self.canary_key = ctx.keys.canary(ctx.node_id)
        self.canaries = {self.canary_key: None}
        self.epoch = 0
        self._everywhere = 0
        self._slot_epochs = {}
        self._slots = {}
        self.events = 0
        self.next_check = 0.0
        self.last_ok = 0.0
        self.wake = lambda: None
        self._counters = {}
        self._lives = itertools.count(1)
        self._lock = threading.Lock()
        self._stepping = None
        self.unjudged = 0

    def declare(
        self,
        reason: str,
        slots: frozenset[int] | None = None,
        readings: Mapping[str, int] | None = None,
    ) -> int:
        """Data was lost in `slots` (None: everywhere): start a new epoch there, forget what was
        learned there; return the new epoch. `readings` are counters read after the loss
        (Loss.readings): they bound their endpoints' ghosts now."""
        with self._lock:
            self.epoch += 1
            self.events += 1
            epoch = self.epoch
            if slots is None:
                self._everywhere = epoch
                self._slot_epochs.clear()
            else:
                self._slot_epochs.update(dict.fromkeys(slots, epoch))
            for endpoint, counter in self._counters.items():
                if self.covers(endpoint, slots):
                    counter.floor = 0
                    counter.ghost_reading_due, counter.ghost_epoch = True, epoch
                    if readings and endpoint in readings:
                        learn_ghosts(counter, readings[endpoint], epoch)
            for key in self.canaries:
                if slots is None or key_slot(key.encode()) in slots:
                    self.canaries[key] = None
        metrics.DATA_LOSS_EVENTS.inc()
        self.next_check = time.monotonic()
        where = "" if slots is None else f" slots={len(slots)}"
        logger.warning("redis lost data reason=%s epoch=%d%s", reason, epoch, where)
        return epoch
