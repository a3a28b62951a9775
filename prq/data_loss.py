"""Noticing that Redis lost or rolled back its state.

Two signs, checked every `data_loss_check_interval_s` (and at once when a wait finds its request
gone):
- the node's canary (canary.lua) must read last + 1 at every check; gone means a restart or a
  flush, an older value means a rollback (restore from an old snapshot, failover to a stale
  replica) that would leave a surviving canary in place;
- every endpoint's enqueue counter must never go down; the node remembers the highest value it
  saw (from its enqueues and from its checks), and a check's reading must not be lower than what
  the node knew when it sent the check (replies of concurrent enqueues arrive in any order, so
  only a check, sent after them, can tell a rollback).

On either sign the node declares data loss: its `epoch` advances, so every call in flight fails
with DataLoss, every request it holds is cancelled with reason `data_loss`, and the next check
writes a fresh canary and learns the counters anew. Pure: the facade's watch loop sends the
calls and reports the replies.
"""

from __future__ import annotations

import logging
import time

from prq._types import Call, Reply
from prq.flows import Context
from prq.scripts import canary_call

logger = logging.getLogger(__name__)

__all__ = ["DataLossWatch"]

#: A canary lives this many check intervals without a check (then it expires, like every key).
CANARY_TTL_CHECKS = 3


class DataLossWatch:
    """One node's canary and remembered enqueue counters."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.canary_key = ctx.keys.canary(ctx.node_id)
        self.canary: int | None = None
        self.counters: dict[str, int] = {}
        self._floor: dict[str, int] = {}
        self.epoch = 0
        self.events = 0
        self.next_check = 0.0
        self.last_check = 0.0

    def check_due(self, now: float) -> bool:
        return now >= self.next_check

    def calls(self, now: float) -> tuple[list[Call], list[str]]:
        """The calls of one check, and the endpoints whose counters they read."""
        interval = self.ctx.settings.data_loss_check_interval_s
        self.next_check = now + interval
        last = self.canary
        if last is not None and now - self.last_check > self._canary_ttl_s():
            last = None  # this node did not check for longer than the canary lives (paused)
        self.canary = last
        self.last_check = now
        endpoints = list(self.counters)
        self._floor = dict(self.counters)
        calls = [canary_call(self.canary_key, int(self._canary_ttl_s() * 1000), last)]
        calls += [Call(("GET", self.ctx.keys.endpoint(e).sequence)) for e in endpoints]
        return calls, endpoints

    def _canary_ttl_s(self) -> float:
        return CANARY_TTL_CHECKS * self.ctx.settings.data_loss_check_interval_s + 1.0

    def settle(self, endpoints: list[str], replies: list[Reply]) -> str | None:
        """Read one check's replies; return why data was lost, or None."""
        canary = replies[0]
        if not isinstance(canary, int):
            return None  # the check failed (Redis away): nothing learned
        expected = None if self.canary is None else self.canary + 1
        self.canary = canary
        if expected is not None and canary != expected:
            return "canary gone" if canary <= 1 else f"canary rolled back ({canary} < {expected})"
        for endpoint, reply in zip(endpoints, replies[1:], strict=True):
            value = int(reply) if isinstance(reply, (bytes, int)) else 0
            floor = self._floor.get(endpoint, 0)
            if value < floor:
                return f"enqueue counter of {endpoint!r} went back from {floor} to {value}"
            self.observe(endpoint, value)
        return None

    def observe(self, endpoint: str, counter: int) -> None:
        """Note an endpoint's enqueue counter (the highest one seen is kept)."""
        self.counters[endpoint] = max(self.counters.get(endpoint, 0), counter)

    def watch_endpoint(self, endpoint: str) -> None:
        """Read this endpoint's counter at each check (a receiver serves it)."""
        self.counters.setdefault(endpoint, 0)

    def declare(self, reason: str) -> int:
        """Data was lost: start a new epoch, forget what was learned; return the new epoch."""
        self.epoch += 1
        self.events += 1
        self.canary = None
        self.counters = dict.fromkeys(self.counters, 0)
        self._floor = {}
        self.next_check = time.monotonic()
        logger.warning("redis lost data reason=%s epoch=%d", reason, self.epoch)
        return self.epoch
