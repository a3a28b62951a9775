"""A data-loss check (prq.node.data_loss): the calls it sends (a canary step on every master, a
reading of the last sequence number of every endpoint in use), and judging its replies against
what the node knew when it sent it.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass

from prq.core.errors import SerializationError
from prq.node.data_loss.counters import EnqueueCounters, Floor
from prq.node.data_loss.scopes import Loss
from prq.protocol.effects import Call, Reply
from prq.protocol.scripts.liveness import canary_call, parse_canary

logger = logging.getLogger(__name__)

__all__ = ["UNJUDGED_WARN", "Check", "LossChecks"]

#: Checks in a row with canary replies that are not counts before the node warns that it
#: cannot tell a loss.
UNJUDGED_WARN = 3


@dataclass(frozen=True, slots=True)
class Check:
    """One data-loss check as it was sent: what it expects, against what it compares."""

    calls: list[Call]
    #: The canaries it steps, in the order of the first calls: key and the last value seen.
    canaries: list[tuple[str, int | None]]
    #: Per endpoint read, in the order of the calls, the floor its reading is judged against.
    floors: dict[str, Floor]
    epoch: int


def _int(reply: Reply) -> int:
    """A counter's reading: its value, 0 for none (or one that is not a number)."""
    if isinstance(reply, int):
        return reply
    if isinstance(reply, bytes):
        try:
            return int(reply)
        except ValueError:
            return 0
    return 0


def _following(call: Call) -> int:
    """The value a canary step writes (canary.lua's ARGV[3]), which its reply should read."""
    value = call.args[-1]
    assert isinstance(value, int)
    return value


class LossChecks(EnqueueCounters):
    """Building and judging data-loss checks (a mixin of `DataLossWatch`)."""

    #: When a check last came back (monotonic): a canary is judged only if that is recent.
    last_ok: float
    #: When the next check is due (monotonic).
    next_check: float
    #: The check whose canary steps are on their way, if any, and when it was sent. Each step
    #: moves a canary on, and a check expects its own step alone: checks sent meanwhile (a
    #: call that found its request gone asks for one at once) read the counters and step no
    #: canary. Forgotten once settled, failed, or older than a canary lives.
    _stepping: tuple[Check, float] | None
    #: Checks in a row whose canary replies were not counts (none judged).
    unjudged: int

    def check_due(self, now: float) -> bool:
        return now >= self.next_check

    def check(self, now: float, in_flight: Collection[str] = ()) -> Check:
        """A check to send now: a canary step on every master, and a reading of the last
        sequence number of every endpoint this node used within a list TTL or has requests
        `in_flight` on."""
        settings = self.ctx.settings
        stale = now - self.last_ok > self.canary_ttl_s()
        layout = self.layout()
        with self._lock:
            self._place_canaries(layout)
            # Out of touch (this node or Redis paused, or Redis unreachable) for longer than a
            # canary lives: its expiry says nothing. Write fresh ones; the counters and the
            # requests' own records still tell a real loss.
            stepping = self._stepping
            if stepping is not None and now - stepping[1] < self.canary_ttl_s():
                canaries: list[tuple[str, int | None]] = []
            else:
                canaries = [(key, None if stale else c.last) for key, c in self.canaries.items()]
            following = [self.canaries[key].following for key, _ in canaries]
            self.next_check = now + settings.data_loss_check_interval_s
            unused = now - settings.list_ttl_s
            for endpoint in [
                e for e, c in self._counters.items() if c.used < unused and e not in in_flight
            ]:
                del self._counters[endpoint]
            floors = {e: Floor(c.floor, self.epoch_of(e)) for e, c in self._counters.items()}
            epoch = self.epoch
        canary_ttl_ms = int(self.canary_ttl_s() * 1000)
        calls = [
            canary_call(key, canary_ttl_ms, last, value)
            for (key, last), value in zip(canaries, following, strict=True)
        ]
        calls += [Call(("GET", self.ctx.keys.endpoint(e).numbers)) for e in floors]
        check = Check(calls, canaries, floors, epoch)
        if canaries:
            with self._lock:
                self._stepping = (check, now)
        return check

    def forget(self, check: Check) -> None:
        """A check that got no reply (failed, or given up): its canary steps are no longer
        on their way, as far as the next check is concerned."""
        with self._lock:
            if self._stepping is not None and self._stepping[0] is check:
                self._stepping = None

    def settle(self, check: Check, replies: list[Reply], now: float) -> Loss | None:
        """Read one check's replies; return the sign of data loss they show, or None.

        A check is judged against what the node knew when it sent the check; a check that was
        overtaken by a declaration (another check, or a take, saw the loss first) says nothing.
        """
        try:
            return self._judge_check(check, replies, now)
        finally:  # (once the canaries it read are booked: a check sent now expects the next)
            self.forget(check)

    def _judge_check(self, check: Check, replies: list[Reply], now: float) -> Loss | None:
        counted = len(check.canaries)
        if check.epoch != self.epoch:  # overtaken by a declaration: says nothing
            return None
        try:
            steps = [parse_canary(reply) for reply in replies[:counted]]
        except SerializationError:
            self._unjudged(replies[:counted])
            return None
        stale = self._judged(now)
        loss: Loss | None = None
        with self._lock:
            for i, ((key, last), (value, clock)) in enumerate(
                zip(check.canaries, steps, strict=True)
            ):
                canary = self.canaries.get(key)
                if canary is None:
                    continue  # (no longer kept: its master serves none of the slots now)
                surprise = value != _following(check.calls[i])
                if surprise and last is not None and not stale and loss is None:
                    why = "canary gone" if value == 0 else f"canary rolled back to {value}"
                    loss = Loss(why, self._scope_of_key(key), canary.good, by_canary=True)
                canary.read(value, clock, surprise)
            if loss is not None:
                return loss
            for i, (endpoint, floor) in enumerate(check.floors.items()):
                counter = self._counters.get(endpoint)
                reply = replies[counted + i]
                if counter is None or isinstance(reply, Exception):
                    continue  # no longer watched (dropped meanwhile), or no reading at all
                loss = self._judge(endpoint, counter, floor, _int(reply), False)
                if loss is not None:
                    return loss
        return None

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
                "meanwhile shows in the sequence numbers only)",
                now - self.last_ok,
            )
        self.last_ok = now
        return stale

    def _unjudged(self, canaries: list[Reply]) -> None:
        """A check whose canary replies are not steps (errors in place): it tells nothing.
        One now and then is a passing error; several in a row leave the node blind to a loss
        its canaries would show, which an operator must hear of."""
        self.unjudged += 1
        logger.debug("data-loss check not judged canaries=%r", canaries)
        if self.unjudged == UNJUDGED_WARN:
            logger.warning(
                "data-loss checks not judged: %d in a row got canary replies that are not "
                "steps, last=%r",
                self.unjudged,
                canaries,
            )
