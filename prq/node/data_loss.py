"""Noticing that Redis lost or rolled back its state.

Two signs, checked every `data_loss_check_interval_s` (and at once when a wait finds its request
gone):
- the node's canary (canary.lua) must read last + 1 at every check; gone means a restart or a
  flush, an older value means a rollback (restore from an old snapshot, failover to a stale
  replica) that would leave a surviving canary in place. One check at a time steps the
  canaries: a check asked for while one is on its way reads the counters only;
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
  took, prq.node.taken; what it ran, prq.node.ran) begin afresh with the life. A life is a number
  that never repeats on one node.
- a node stops reading, refreshing and remembering the counter of an endpoint it has not used
  (enqueued on, taken from, held or waited on) for a list TTL; the counter then expires a list
  TTL after the last refresh, and the endpoint starts a new life if the node uses it again.

This needs `data_loss_check_interval_s` below half of `list_ttl_s` (60 s and 12 h by default):
with a longer interval no floor stays vouched for from one check to the next, so only the
canary tells a loss and every check starts a new life.

On either sign the node declares data loss: its `epoch` advances, so every call in flight fails
with DataLoss, every request it holds is cancelled with reason `data_loss`, and the next check
writes a fresh canary and learns the counters anew (a declaration keeps the lives: prq.node.taken
still refuses what the rolled-back Redis hands out again). What that Redis still queues from
before the loss (*ghosts*: a stale replica misses the takes and answers of requests that ran)
must not run again, on this node or any other: a reading of an endpoint's counter made after
the loss is at least every ghost's sequence number, so takes refuse, and cancel with reason
`data_loss`, the requests numbered up to it. The first such reading is, on one server, the
declaring check's own (read behind the canary, on the same connection), or the reading that
went back; otherwise the first one sent after the declaration (a take's or a check's: one sent
before it may show the counter before the loss, and mark requests queued since). Requests
queued between the loss and that reading are refused with the ghosts (their callers get
DataLoss, which is retryable): on one server only those queued before the check that saw the
loss; on a cluster also those queued within the round trip after it. Pure, and thread-safe
(the blocking facade takes from several threads): the facade's watch loop sends the calls and
reports the replies.

On a Redis Cluster each master can lose its data alone (flushed, restarted empty, failed over
to a stale replica), so a loss has a *scope*: the slots of the master that lost it. The node
keeps a canary on every master (a key whose slot that master serves, found from the slot table
the client keeps), and a sign on one master declares data loss for that master's slots only:
the calls and held requests of endpoints there fail, the others go on. Each endpoint's epoch is
that of the last declaration whose scope held its slot. A canary stays where it is while its
master keeps the slot (a failover keeps the key on the promoted replica, so a stale one shows
as a rollback); a master without one gets a fresh one.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from redis.crc import key_slot

from prq.observe import metrics
from prq.protocol.effects import Call, Reply
from prq.protocol.flows.context import Context
from prq.protocol.scripts.liveness import canary_call

logger = logging.getLogger(__name__)

__all__ = ["Check", "DataLossWatch", "Floor", "Layout", "Loss"]

#: A cluster's masters and the slots each serves (prq.transport.links.shard_layout); None: one
#: server.
Layout = dict[str, list[int]] | None

#: A canary lives this many check intervals (plus the retry budget) without a check.
CANARY_TTL_CHECKS = 3
#: A check that refreshed an enqueue counter vouches for it this share of a list TTL.
VOUCHED_SHARE = 0.5
#: Checks in a row with canary replies that are not counts before the node warns that it
#: cannot tell a loss.
UNJUDGED_WARN = 3
#: How many key names a search for a canary on a given master tries before giving up on it.
CANARY_SEARCH_LIMIT = 200_000


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
    #: The canaries it steps, in the order of the first calls: key and the last value seen.
    canaries: list[tuple[str, int | None]]
    #: Per endpoint read, in the order of the calls, the floor its reading is judged against
    #: (None: not vouched for).
    floors: dict[str, Floor | None]
    epoch: int
    #: When it was sent (monotonic): its refreshes vouch for the counters from then.
    sent_at: float


@dataclass(frozen=True, slots=True)
class Loss:
    """A sign of data loss: why, and which slots it covers (None: all of Redis)."""

    reason: str
    slots: frozenset[int] | None = None
    #: Counter readings that surely ran after the loss (DataLossWatch._read_after): each
    #: bounds its endpoint's ghosts at once, so that requests queued after it are not refused
    #: as ghosts. The others are bounded by the first reading sent after the declaration.
    readings: Mapping[str, int] = field(default_factory=dict)


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


def _learn_ghosts(counter: _Counter, value: int, sent_epoch: int) -> None:
    """A reading of the counter sent in epoch `sent_epoch` came back: the first sent since a
    declaration tells how far the ghosts go (the counter is then at least at every ghost's
    number: the Redis that lost data numbered them all before the reading)."""
    if counter.ghost_reading_due and sent_epoch >= counter.ghost_epoch:
        counter.ghosts_up_to = max(counter.ghosts_up_to, value)
        counter.ghost_reading_due = False


def _int(reply: Reply) -> int:
    return int(reply) if isinstance(reply, (bytes, int)) else 0


class DataLossWatch:
    """One node's canary and remembered enqueue counters."""

    def __init__(self, ctx: Context, layout: Callable[[], Layout] = lambda: None) -> None:
        self.ctx = ctx
        #: The cluster's layout as the client knows it now (None: one server).
        self.layout = layout
        self.canary_key = ctx.keys.canary(ctx.node_id)
        #: Each canary's key -> the value it read last (None: write a fresh one), oldest first.
        self.canaries: dict[str, int | None] = {self.canary_key: None}
        #: The number of the last declaration; the epoch of a slot is that of the last one
        #: whose scope held it.
        self.epoch = 0
        self._everywhere = 0
        self._slot_epochs: dict[int, int] = {}
        self._slots: dict[str, int] = {}
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
        #: The check whose canary steps are on their way, if any. Each step moves a canary
        #: on, and a check expects its own step alone: checks sent meanwhile (a call that
        #: found its request gone asks for one at once) read the counters and step no canary.
        #: Forgotten once settled, failed, or older than a canary lives.
        self._stepping: Check | None = None
        #: Checks in a row whose canary replies were not counts (none judged).
        self.unjudged = 0

    def check_due(self, now: float) -> bool:
        return now >= self.next_check

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

    def check(self, now: float, in_flight: Collection[str] = ()) -> Check:
        """A check to send now: a canary step on every master, and a reading and a refresh of
        the counter of every endpoint this node used within a list TTL or has requests
        `in_flight` on."""
        settings = self.ctx.settings
        stale = now - self.last_ok > self.canary_ttl_s()
        layout = self.layout()
        with self._lock:
            self._place_canaries(layout)
            # Out of touch (this node or Redis paused, or Redis unreachable) for longer than a
            # canary lives: its expiry says nothing. Write fresh ones; the counters and the
            # requests' own hashes still tell a real loss.
            stepping = self._stepping
            if stepping is not None and now - stepping.sent_at < self.canary_ttl_s():
                canaries: list[tuple[str, int | None]] = []
            else:
                canaries = [(key, None if stale else last) for key, last in self.canaries.items()]
            self.next_check = now + settings.data_loss_check_interval_s
            unused = now - settings.list_ttl_s
            for endpoint in [
                e for e, c in self._counters.items() if c.used < unused and e not in in_flight
            ]:
                del self._counters[endpoint]
            floors = {e: self._floor(e, self._counter(e, now)) for e in list(self._counters)}
            epoch = self.epoch
        ttl_ms = int(settings.list_ttl_s * 1000)
        canary_ttl_ms = int(self.canary_ttl_s() * 1000)
        calls = [canary_call(key, canary_ttl_ms, last) for key, last in canaries]
        for endpoint in floors:
            key = self.ctx.keys.endpoint(endpoint).sequence
            calls += [Call(("GET", key)), Call(("PEXPIRE", key, ttl_ms))]
        check = Check(calls, canaries, floors, epoch, now)
        if canaries:
            with self._lock:
                self._stepping = check
        return check

    def forget(self, check: Check) -> None:
        """A check that got no reply (failed, or given up): its canary steps are no longer
        on their way, as far as the next check is concerned."""
        with self._lock:
            if self._stepping is check:
                self._stepping = None

    def settle(self, check: Check, replies: list[Reply], now: float) -> Loss | None:
        """Read one check's replies; return the sign of data loss they show, or None.

        A check is judged against what the node knew when it sent the check; a check that was
        overtaken by a declaration (another check, or a take, saw the loss first) says nothing.
        """
        try:
            return self._judge(check, replies, now)
        finally:  # (once the canaries it read are booked: a check sent now expects the next)
            self.forget(check)

    def _judge(self, check: Check, replies: list[Reply], now: float) -> Loss | None:
        counted = len(check.canaries)
        if check.epoch != self.epoch:  # overtaken by a declaration: says nothing
            return None
        if not all(isinstance(r, int) for r in replies[:counted]):
            self._unjudged(replies[:counted])
            return None
        stale = self._judged(now)
        for (key, last), canary in zip(check.canaries, replies[:counted], strict=True):
            assert isinstance(canary, int)
            with self._lock:
                if key in self.canaries:
                    self.canaries[key] = canary
            if last is None or stale:  # out of touch for longer than it lives: may have expired
                continue
            if canary != last + 1:
                expected = last + 1
                why = (
                    "canary gone" if canary <= 1 else f"canary rolled back ({canary} < {expected})"
                )
                return Loss(why, self._scope_of_key(key), self._read_after(check, replies, None))
        vouched_until = check.sent_at + VOUCHED_SHARE * self.ctx.settings.list_ttl_s
        with self._lock:
            for i, (endpoint, floor) in enumerate(check.floors.items()):
                if endpoint not in self._counters:
                    continue  # dropped by a check sent meanwhile: no longer watched
                counter = self._counter(endpoint, now)
                value = _int(replies[counted + 2 * i])
                reason = self._went_back(endpoint, counter, floor, value)
                if reason:
                    readings = self._read_after(check, replies, i)
                    return Loss(reason, self.scope_of(endpoint), readings)
                counter.floor = max(counter.floor, value)
                _learn_ghosts(counter, value, check.epoch)
                if replies[counted + 1 + 2 * i] == 1:  # it was there; lives a list TTL from now
                    counter.vouched_until = max(counter.vouched_until or 0.0, vouched_until)
        return None

    def _read_after(self, check: Check, replies: list[Reply], shown: int | None) -> dict[str, int]:
        """The check's counter readings that surely ran after the loss it showed, at its
        canaries (`shown` None) or at the reading of its endpoint number `shown`: that
        reading itself, anywhere; and on one server every reading behind the sign, since a
        round trip's calls run in order on one connection (a flush by another client may land
        between two of them, so not the readings in front of it; a restart or a failover ends
        the connection). On a cluster the calls to different masters run apart, and redis-py
        sends a redirected call again after the others: the first reading sent after the
        declaration bounds the ghosts of the other endpoints there."""
        counted = len(check.canaries)
        one_server = self.layout() is None
        readings: dict[str, int] = {}
        for i, endpoint in enumerate(check.floors):
            reply = replies[counted + 2 * i]
            after = i == shown or (one_server and i >= (shown or 0))
            if after and (reply is None or isinstance(reply, (bytes, int))):
                readings[endpoint] = _int(reply)
        return readings

    def _judged(self, now: float) -> bool:
        """A check is judged now; whether the node was out of touch for longer than a canary
        lives (its canaries' expiry then says nothing: they are written afresh)."""
        if self.unjudged >= UNJUDGED_WARN:
            logger.info("data-loss checks judged again after %d that were not", self.unjudged)
        self.unjudged = 0
        stale = now - self.last_ok > self.canary_ttl_s()
        if stale and self.last_ok:
            logger.info(
                "data-loss check after %.1f s out of touch: canaries written afresh (a loss "
                "meanwhile shows in the enqueue counters only)",
                now - self.last_ok,
            )
        self.last_ok = now
        return stale

    def _unjudged(self, canaries: list[Reply]) -> None:
        """A check whose canary replies are not counts (errors in place): it tells nothing.
        One now and then is a passing error; several in a row leave the node blind to a loss
        its canaries would show, which an operator must hear of."""
        self.unjudged += 1
        logger.debug("data-loss check not judged canaries=%r", canaries)
        if self.unjudged == UNJUDGED_WARN:
            logger.warning(
                "data-loss checks not judged: %d in a row got canary replies that are not "
                "counts, last=%r",
                self.unjudged,
                canaries,
            )

    def _scope_of_key(self, key: str) -> frozenset[int] | None:
        layout = self.layout()
        if layout is None:
            return None
        slot = key_slot(key.encode())
        for slots in layout.values():
            if slot in slots:
                return frozenset(slots)
        return frozenset((slot,))

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
                _learn_ghosts(counter, value, sent_epoch)
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
                        _learn_ghosts(counter, readings[endpoint], epoch)
            for key in self.canaries:
                if slots is None or key_slot(key.encode()) in slots:
                    self.canaries[key] = None
        metrics.DATA_LOSS_EVENTS.inc()
        self.next_check = time.monotonic()
        where = "" if slots is None else f" slots={len(slots)}"
        logger.warning("redis lost data reason=%s epoch=%d%s", reason, epoch, where)
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
