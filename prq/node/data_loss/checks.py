"""A data-loss check (prq.node.data_loss): the calls it sends (a canary step on every master, a
reading and a refresh of every counter in use), and judging its replies against what the node
knew when it sent it.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from prq.node.data_loss.counters import EnqueueCounters, Floor, learn_ghosts
from prq.protocol.effects import Call, Reply
from prq.protocol.scripts.liveness import canary_call

logger = logging.getLogger(__name__)

__all__ = ["UNJUDGED_WARN", "VOUCHED_SHARE", "Check", "Loss", "LossChecks"]

#: A check that refreshed an enqueue counter vouches for it this share of a list TTL.
VOUCHED_SHARE = 0.5
#: Checks in a row with canary replies that are not counts before the node warns that it
#: cannot tell a loss.
UNJUDGED_WARN = 3


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


def _int(reply: Reply) -> int:
    return int(reply) if isinstance(reply, (bytes, int)) else 0


class LossChecks(EnqueueCounters):
    """Building and judging data-loss checks (a mixin of `DataLossWatch`)."""

    #: When a check last came back (monotonic): a canary is judged only if that is recent.
    last_ok: float
    #: The check whose canary steps are on their way, if any. Each step moves a canary
    #: on, and a check expects its own step alone: checks sent meanwhile (a call that
    #: found its request gone asks for one at once) read the counters and step no canary.
    #: Forgotten once settled, failed, or older than a canary lives.
    _stepping: Check | None
    #: Checks in a row whose canary replies were not counts (none judged).
    unjudged: int

    def check_due(self, now: float) -> bool:
        return now >= self.next_check

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
                learn_ghosts(counter, value, check.epoch)
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
