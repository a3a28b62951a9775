"""Noticing that Redis lost or rolled back its state.

Two signs, checked every `data_loss_check_interval_s` (and at once when a wait finds its request
gone):
- the node's canary (canary.lua) must read last + 1 at every check; gone means a restart or a
  flush, an older value means a rollback (restore from an old snapshot, failover to a stale
  replica) that would leave a surviving canary in place;
- every endpoint's enqueue counter must never go down; the node remembers the highest value it
  saw (its *floor*: from its enqueues, its takes and its checks), and a reading must not be
  lower than the floor the node knew when it sent the reading (replies of concurrent enqueues
  arrive in any order, so only a reading sent after them can tell a rollback).

An enqueue counter expires, and that is no loss: enqueues set its TTL to a list TTL
(`list_ttl_s`, 1 day), so an endpoint nobody enqueues on for that long loses its counter, and
the next enqueue starts again from 1. So that a floor is never compared with a counter that
expired in its own time:
- each check also refreshes the TTL of every counter it reads (PEXPIRE, which does nothing to a
  counter that is gone: one lost to a flush or a restore stays lost, and the canary tells a
  flush anyway). A counter lives as long as some node compares against it.
- a node *vouches* for a counter for half a list TTL after sending a check that found and
  refreshed it; the other half covers the check's own delays (retries, a slow reply). A floor
  that is not vouched for is not compared: the node was out of touch (Redis away, the node
  paused), or has not checked a counter it just met (a new endpoint brings a check at once).
- a floor whose vouching lapsed starts a new *life* of the counter: it may have expired and
  started again, so its sequence numbers repeat, and the receiver's memories of them (what it
  took, prq.taken; what it ran, prq.ran) begin afresh with the life. A life is a number that
  never repeats on one node.
- a node stops reading, refreshing and remembering the counter of an endpoint it has not used
  (enqueued on, taken from, held or waited on) for a list TTL; the counter then expires a list
  TTL after the last refresh, and the endpoint starts a new life if the node uses it again.

This needs `data_loss_check_interval_s` below half of `list_ttl_s` (60 s and 12 h by default):
with a longer interval no floor stays vouched for from one check to the next, so only the
canary tells a loss and every check starts a new life.

On either sign the node declares data loss: its `epoch` advances, so every call in flight fails
with DataLoss, every request it holds is cancelled with reason `data_loss`, and the next check
writes a fresh canary and learns the counters anew (a declaration keeps the lives: prq.taken
still refuses what the rolled-back Redis hands out again). Pure, and thread-safe (the blocking
facade takes from several threads): the facade's watch loop sends the calls and reports the
replies.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from prq import metrics
from prq._types import Call, Reply
from prq.flows import Context
from prq.scripts import canary_call

logger = logging.getLogger(__name__)

__all__ = ["Check", "DataLossWatch", "Floor"]

#: A canary lives this many check intervals (plus the retry budget) without a check.
CANARY_TTL_CHECKS = 3
#: A check that refreshed an enqueue counter vouches for it this share of a list TTL.
VOUCHED_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class Floor:
    """What an enqueue counter must not be below when a reading sent now comes back: the
    value, in which life of the counter, and in which epoch of the node."""

    value: int
    life: int
    epoch: int


@dataclass(frozen=True, slots=True)
class Check:
    """One data-loss check as it was sent: what it expects, against what it compares."""

    calls: list[Call]
    last: int | None
    #: Per endpoint read, in the order of the calls, the floor its reading is judged against
    #: (None: not vouched for).
    floors: dict[str, Floor | None]
    epoch: int
    #: When it was sent (monotonic): its refreshes vouch for the counters from then.
    sent_at: float


@dataclass(slots=True)
class _Counter:
    """What a node knows of one endpoint's enqueue counter."""

    life: int
    #: When this node last used the endpoint (monotonic).
    used: float
    floor: int = 0
    #: Until when (monotonic) the counter surely lives, but for a loss; None: not vouched for.
    vouched_until: float | None = None


def _int(reply: Reply) -> int:
    return int(reply) if isinstance(reply, (bytes, int)) else 0


class DataLossWatch:
    """One node's canary and remembered enqueue counters."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.canary_key = ctx.keys.canary(ctx.node_id)
        self.canary: int | None = None
        self.epoch = 0
        self.events = 0
        self.next_check = 0.0
        #: When a check last came back (monotonic): a canary is judged only if that is recent.
        self.last_ok = 0.0
        #: Called when an endpoint is new to the node: its check is due at once (set by the
        #: node's watch, which wakes its loop).
        self.wake: Callable[[], None] = lambda: None
        self._counters: dict[str, _Counter] = {}
        self._lives = itertools.count(1)
        self._lock = threading.Lock()

    def check_due(self, now: float) -> bool:
        return now >= self.next_check

    def canary_ttl_s(self) -> float:
        """A canary outlives a few missed checks and a Redis pause within the retry budget."""
        settings = self.ctx.settings
        return (
            CANARY_TTL_CHECKS * settings.data_loss_check_interval_s + settings.retry_budget_s + 1.0
        )

    def check(self, now: float, in_flight: Collection[str] = ()) -> Check:
        """A check to send now: the canary step, and a reading and a refresh of the counter of
        every endpoint this node used within a list TTL or has requests `in_flight` on."""
        settings = self.ctx.settings
        last = self.canary
        if last is not None and now - self.last_ok > self.canary_ttl_s():
            # This node was out of touch (it, or Redis, paused; or Redis unreachable) for longer
            # than the canary lives: its expiry says nothing. Write a fresh one; the counters
            # and the requests' own hashes still tell a real loss.
            last = None
        with self._lock:
            self.next_check = now + settings.data_loss_check_interval_s
            unused = now - settings.list_ttl_s
            for endpoint in [
                e for e, c in self._counters.items() if c.used < unused and e not in in_flight
            ]:
                del self._counters[endpoint]
            floors = {e: self._floor(self._counter(e, now)) for e in list(self._counters)}
            epoch = self.epoch
        ttl_ms = int(settings.list_ttl_s * 1000)
        calls = [canary_call(self.canary_key, int(self.canary_ttl_s() * 1000), last)]
        for endpoint in floors:
            key = self.ctx.keys.endpoint(endpoint).sequence
            calls += [Call(("GET", key)), Call(("PEXPIRE", key, ttl_ms))]
        return Check(calls, last, floors, epoch, now)

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
        vouched_until = check.sent_at + VOUCHED_SHARE * self.ctx.settings.list_ttl_s
        with self._lock:
            for i, (endpoint, floor) in enumerate(check.floors.items()):
                if endpoint not in self._counters:
                    continue  # dropped by a check sent meanwhile: no longer watched
                counter = self._counter(endpoint, now)
                value = _int(replies[1 + 2 * i])
                reason = self._went_back(endpoint, counter, floor, value)
                if reason:
                    return reason
                counter.floor = max(counter.floor, value)
                if replies[2 + 2 * i] == 1:  # it was there, and lives a list TTL from now on
                    counter.vouched_until = max(counter.vouched_until or 0.0, vouched_until)
        return None

    def floor(self, endpoint: str, now: float) -> Floor | None:
        """The floor a reading of `endpoint`'s counter sent now is judged against (None: not
        vouched for, the reading cannot tell a loss); a use of the endpoint."""
        with self._lock:
            return self._floor(self._counter(endpoint, now, used=True))

    def read(self, endpoint: str, floor: Floor | None, value: int, now: float) -> str | None:
        """A reading of the counter (a take's), sent when `floor` was had: why it shows data
        loss, or None (the value is then learned)."""
        with self._lock:
            counter = self._counter(endpoint, now, used=True)
            reason = self._went_back(endpoint, counter, floor, value)
            if not reason:
                counter.floor = max(counter.floor, value)
            return reason

    def observe(self, endpoint: str, value: int, now: float) -> None:
        """Note an endpoint's counter as this node's own enqueue (or a take after a
        declaration) reported it: the highest value seen is kept; a use of the endpoint."""
        with self._lock:
            counter = self._counter(endpoint, now, used=True)
            counter.floor = max(counter.floor, value)

    def life(self, endpoint: str, now: float) -> int:
        """The endpoint's counter's life now: sequence numbers seen in another life may belong
        to other requests (module docstring)."""
        with self._lock:
            return self._counter(endpoint, now, used=True).life

    def declare(self, reason: str) -> int:
        """Data was lost: start a new epoch, forget what was learned; return the new epoch."""
        with self._lock:
            self.epoch += 1
            self.events += 1
            for counter in self._counters.values():
                counter.floor = 0
            epoch = self.epoch
        metrics.DATA_LOSS_EVENTS.inc()
        self.canary = None
        self.next_check = time.monotonic()
        logger.warning("redis lost data reason=%s epoch=%d", reason, epoch)
        return epoch

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
        if used:
            counter.used = max(counter.used, now)
        return counter

    def _floor(self, counter: _Counter) -> Floor | None:
        if counter.vouched_until is None:
            return None
        return Floor(counter.floor, counter.life, self.epoch)

    def _went_back(
        self, endpoint: str, counter: _Counter, floor: Floor | None, value: int
    ) -> str | None:
        """Why a reading below `floor` is data loss, if it is: the floor was vouched for when
        the reading was sent, and neither a new life nor a declaration came since."""
        if floor is None or floor.life != counter.life or floor.epoch != self.epoch:
            return None
        if value < floor.value:
            return f"enqueue counter of {endpoint!r} went back from {floor.value} to {value}"
        return None
