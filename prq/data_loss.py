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
from dataclasses import dataclass

from prq import metrics
from prq._types import Call, Reply
from prq.flows import Context
from prq.scripts import canary_call

logger = logging.getLogger(__name__)

__all__ = ["Check", "DataLossWatch"]

#: A canary lives this many check intervals (plus the retry budget) without a check.
CANARY_TTL_CHECKS = 3


@dataclass(frozen=True, slots=True)
class Check:
    """One data-loss check as it was sent: what it expects, against what it compares."""

    calls: list[Call]
    endpoints: list[str]
    last: int | None
    floors: dict[str, int]
    epoch: int


class DataLossWatch:
    """One node's canary and remembered enqueue counters."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.canary_key = ctx.keys.canary(ctx.node_id)
        self.canary: int | None = None
        self.counters: dict[str, int] = {}
        self.epoch = 0
        self.events = 0
        self.next_check = 0.0
        #: When a check last came back (monotonic): a canary is judged only if that is recent.
        self.last_ok = 0.0

    def check_due(self, now: float) -> bool:
        return now >= self.next_check

    def canary_ttl_s(self) -> float:
        """A canary outlives a few missed checks and a Redis pause within the retry budget."""
        settings = self.ctx.settings
        return (
            CANARY_TTL_CHECKS * settings.data_loss_check_interval_s + settings.retry_budget_s + 1.0
        )

    def check(self, now: float) -> Check:
        """A check to send now (the canary step and the counters this node knows)."""
        self.next_check = now + self.ctx.settings.data_loss_check_interval_s
        last = self.canary
        if last is not None and now - self.last_ok > self.canary_ttl_s():
            # This node was out of touch (it, or Redis, paused; or Redis unreachable) for longer
            # than the canary lives: its expiry says nothing. Write a fresh one; the counters
            # and the requests' own hashes still tell a real loss.
            last = None
        endpoints = list(self.counters)
        calls = [canary_call(self.canary_key, int(self.canary_ttl_s() * 1000), last)]
        calls += [Call(("GET", self.ctx.keys.endpoint(e).sequence)) for e in endpoints]
        return Check(calls, endpoints, last, dict(self.counters), self.epoch)

    def settle(self, check: Check, replies: list[Reply], now: float) -> str | None:
        """Read one check's replies; return why data was lost, or None.

        A check is judged against what the node knew when it sent the check; a check that was
        overtaken by a declaration (another check, or a take, saw the loss first) says nothing.
        """
        canary = replies[0]
        if not isinstance(canary, int) or check.epoch != self.epoch:
            return None
        expected = None if check.last is None else check.last + 1
        if now - self.last_ok > self.canary_ttl_s():
            expected = None  # out of touch for longer than the canary lives: it may have expired
        self.last_ok = now
        self.canary = canary
        if expected is not None and canary != expected:
            return "canary gone" if canary <= 1 else f"canary rolled back ({canary} < {expected})"
        for endpoint, reply in zip(check.endpoints, replies[1:], strict=True):
            value = int(reply) if isinstance(reply, (bytes, int)) else 0
            floor = check.floors.get(endpoint, 0)
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
        metrics.DATA_LOSS_EVENTS.inc()
        self.canary = None
        self.counters = dict.fromkeys(self.counters, 0)
        self.next_check = time.monotonic()
        logger.warning("redis lost data reason=%s epoch=%d", reason, self.epoch)
        return self.epoch
