"""One node's data-loss watch (prq.node.data_loss): its canaries, marks and floors at start, and
declaring a loss (a new epoch and a higher fence where it happened).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from redis.crc import key_slot

from prq.node.data_loss.checks import LossChecks
from prq.node.data_loss.scopes import NO_MARK, Canary, Layout, Loss, Mark
from prq.observe import metrics
from prq.protocol.flows.context import Context

logger = logging.getLogger(__name__)

__all__ = ["DataLossWatch"]


class DataLossWatch(LossChecks):
    """One node's canaries, fences and floors."""

    def __init__(self, ctx: Context, layout: Callable[[], Layout] = lambda: None) -> None:
        """Build the watch's state: each part is typed, and described, where it is declared
        (scopes, counters, checks)."""
        self.ctx = ctx
        self.layout = layout
        self.canary_key = ctx.keys.canary(ctx.node_id)
        self.canaries = {self.canary_key: Canary()}
        self.epoch = 0
        self._everywhere = NO_MARK
        self._slot_marks = {}
        self._slots = {}
        self.events = 0
        self.next_check = 0.0
        self.last_ok = 0.0
        #: Called when a check is due at once (set by the node's watch, which wakes its loop).
        self.wake = lambda: None
        self._counters = {}
        self._lock = threading.Lock()
        self._stepping = None
        self.unjudged = 0

    def check_soon(self) -> None:
        """Something looked like a loss (a record gone, a counter gone): check now."""
        self.next_check = 0.0
        self.wake()

    def declare(self, loss: Loss) -> int:
        """Data was lost in `loss.slots` (None: everywhere): start a new epoch there under
        `loss.fence`, forget the floors there; return the epoch. The canaries there step on
        from what the declaring check read, if a canary showed the loss (a loss after it shows
        at the next check); else they are written afresh at the next check, at once."""
        slots = loss.slots
        with self._lock:
            self.epoch += 1
            self.events += 1
            epoch = self.epoch
            if slots is None:
                self._everywhere = Mark(epoch, max(self._everywhere.fence, loss.fence))
            else:
                for slot in slots:
                    fence = self._slot_marks.get(slot, NO_MARK).fence
                    self._slot_marks[slot] = Mark(epoch, max(fence, loss.fence))
            for endpoint, counter in self._counters.items():
                if self.covers(endpoint, slots):
                    counter.floor = 0
            if not loss.by_canary:
                for key, canary in self.canaries.items():
                    if slots is None or key_slot(key.encode()) in slots:
                        canary.last = None
        metrics.DATA_LOSS_EVENTS.inc()
        self.next_check = 0.0
        where = "" if slots is None else f" slots={len(slots)}"
        logger.warning(
            "redis lost data reason=%s epoch=%d fence=%d%s", loss.reason, epoch, loss.fence, where
        )
        return epoch
