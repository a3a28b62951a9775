"""What a node knows of each endpoint's sequence numbers, and judging a reading of them
(prq.node.data_loss, second part).

An endpoint's *floor* is the highest sequence number the node read there (its enqueues', its
takes' and its checks' readings). A reading is judged against the floor the node had when it
sent the reading, and only if no declaration covered the endpoint since (replies of concurrent
steps arrive in any order; one sent before a declaration may show Redis from before the loss).
A reading below that floor, of a counter that exists, is a rollback. A counter that does not
exist is no sign by itself (it expires when idle; a flush shows in the canary), but a node that
read it lately checks at once; the floor stays (numbers rise with the server's clock, so a
counter written again reads above it, and a rollback after the counter was gone reads below).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from prq.node.data_loss.scopes import Loss, LossScopes

__all__ = ["STAMP_TRUST_SHARE", "CallMark", "CallStamps", "EnqueueCounters", "Floor"]

#: A take (an enqueue) carries the node's receiver (sender) stamp only within this share of a
#: list TTL (the stamp's TTL) after the step that read it: later, the stamp may have expired,
#: which says nothing.
STAMP_TRUST_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class Floor:
    """What a reading sent now is judged against: the endpoint's floor, and its epoch; for a
    take, the receiver's stamp there it sends (0: none it can rely on), and when it was sent
    (monotonic)."""

    value: int
    epoch: int
    stamp: int = 0
    at: float = 0.0
    #: The epoch the endpoint was in when the node learned `stamp`.
    stamp_epoch: int = 0
    #: For an enqueue: the generation of the sender stamp it carries (its key's name).
    key: int = 0


@dataclass(slots=True)
class CallMark:
    """A call in flight as a data loss judges it: its endpoint, the epoch it was last judged
    in, the floor when it began, and its request's sequence number once the enqueue answered
    (None: not enqueued yet; 0: not known, the id was known already). A declaration fails the
    call unless the number is above the new fence (DataLossWatch.survives)."""

    endpoint: str
    epoch: int
    floor: Floor
    number: int | None = None


# (not frozen: one per endpoint, updated on every reading)
@dataclass(slots=True)
class _Counter:
    #: The highest sequence number read (0: none since the node last forgot it).
    floor: int = 0
    #: When the node last used the endpoint (monotonic): forgotten a list TTL later.
    used: float = 0.0
    #: The floor at which a reading last found the counter gone (a check was asked for then;
    #: another is asked for only once a number was read again).
    gone_at: int = 0
    #: This node's stamp as a receiver here (take.lua: the server's clock at its last take, µs;
    #: it only grows on one server's data), and when the take that read it was sent
    #: (monotonic). Kept across declarations: it is judged by its own rule.
    stamp: int = 0
    stamped: float = 0.0
    #: The endpoint's epoch when the node learned `stamp`: a declaration since may be of the
    #: loss the stamp shows next (another sign of it came first).
    stamp_epoch: int = 0
    #: This node's stamp as a sender here (enqueue.lua, stamp.lua: the server's clock at its
    #: last enqueue, µs), its generation (the key holding it), the epoch it was learned in,
    #: and when the step that read it was sent (monotonic); the last generation drawn. A stamp
    #: written afresh goes to a key of a new generation, so that no enqueue on its way with an
    #: older one finds it there; one learned before a declaration is not carried.
    sent: int = 0
    sent_key: int = 0
    sent_epoch: int = 0
    sent_at: float = 0.0
    generations: int = 0


@dataclass(slots=True)
class CallStamps:
    """The node's stamp on a call's endpoint as the call's enqueue carries it
    (prq.protocol.flows.call.Stamps): the floor it is sent with becomes the call's mark's, so
    that its reply is judged against it (NodeWatch.enqueued)."""

    counters: EnqueueCounters
    mark: CallMark

    def sending(self) -> tuple[int, int]:
        floor = self.counters.sent_floor(self.mark.endpoint, time.monotonic())
        self.mark.floor = floor
        return floor.key, floor.stamp

    def learned(self, stamp: int) -> None:
        self.mark.floor = dataclasses.replace(self.mark.floor, stamp=stamp)
        self.counters.sent_learned(self.mark.endpoint, self.mark.floor, stamp)


class EnqueueCounters(LossScopes):
    """The floors of one node's endpoints (a mixin of `DataLossWatch`)."""

    _counters: dict[str, _Counter]

    def floor(self, endpoint: str, now: float) -> Floor:
        """The floor a reading of `endpoint` sent now is judged against, with the stamp a take
        sent now carries (0 when it may have expired since: it lives a list TTL from the take
        that read it, and a stamp gone is a sign only while it cannot have); a use of it."""
        with self._lock:
            counter = self._counter(endpoint, now)
            fresh = now - counter.stamped < self.ctx.settings.list_ttl_s * STAMP_TRUST_SHARE
            stamp = counter.stamp if fresh else 0
            epoch = self.epoch_of(endpoint)
            return Floor(counter.floor, epoch, stamp, now, counter.stamp_epoch)

    def stamped(
        self, endpoint: str, floor: Floor, stamp: int, went_back: int | None
    ) -> Loss | None:
        """A take sent when `floor` was had answered the receiver's `stamp` (take.lua) and,
        when it found the stamp below `floor.stamp`, what it held (`went_back`; 0: gone):
        Redis lost or rolled back the data since this node's take that read `floor.stamp`, so
        all it holds now from before is numbered below that, a server time before the loss:
        the fence. The sign of a loss, or None: none, or one declared already with that fence
        or a higher one (nothing more to refuse), or one a declaration since the node learned
        `floor.stamp` may be of (another sign of the same loss came first): its fence is
        raised to this one, in the epoch it is in, so that no loss is declared twice (one that
        came after that declaration shows in its canary at the next check)."""
        with self._lock:
            epoch = self._learn(endpoint, floor, stamp)
            if went_back is None:
                return None
            # (forgotten: the next take sends none and writes a fresh stamp; the takes already
            # sent with it find it low as well, since a take that finds it low leaves it)
            counter = self._counter(endpoint, floor.at)
            counter.stamp, counter.stamped, counter.stamp_epoch = 0, floor.at, epoch
            if floor.stamp <= self.fence_of(endpoint):
                return None
            if floor.stamp_epoch != epoch:
                self._raise_fence(self.scope_of(endpoint), floor.stamp)
                return None
        what = "is gone" if went_back == 0 else f"went back to {went_back}"
        reason = f"the receiver's stamp on {endpoint!r} was {floor.stamp} and {what}"
        return Loss(reason, self.scope_of(endpoint), floor.stamp)

    def learned(self, endpoint: str, floor: Floor, stamp: int) -> None:
        """A take sent when `floor` was had wrote the receiver's `stamp` and found none below
        (its flow may wait on before it is judged): the node's takes sent from now carry it."""
        with self._lock:
            self._learn(endpoint, floor, stamp)

    def _learn(self, endpoint: str, floor: Floor, stamp: int) -> int:
        """Keep `stamp` if it is the highest yet (under the lock); the epoch now."""
        counter = self._counter(endpoint, floor.at)
        epoch = self.epoch_of(endpoint)
        if stamp > counter.stamp:
            counter.stamp, counter.stamped, counter.stamp_epoch = stamp, floor.at, epoch
        return epoch

    def sent_floor(self, endpoint: str, now: float) -> Floor:
        """The floor an enqueue sent now is judged against, with the node's sender stamp there
        it carries (`stamp`) and its generation (`key`); when the node knows none it can rely
        on (none learned in this epoch, or it may have expired since), `stamp` is 0 and `key`
        a new generation, for the stamp to write afresh (stamp.lua). A use of the endpoint."""
        with self._lock:
            counter = self._counter(endpoint, now)
            epoch = self.epoch_of(endpoint)
            fresh = now - counter.sent_at < self.ctx.settings.list_ttl_s * STAMP_TRUST_SHARE
            if counter.sent and fresh and counter.sent_epoch == epoch:
                return Floor(counter.floor, epoch, counter.sent, now, epoch, counter.sent_key)
            counter.generations += 1
            return Floor(counter.floor, epoch, 0, now, epoch, counter.generations)

    def sent_learned(self, endpoint: str, floor: Floor, stamp: int) -> None:
        """An enqueue (or stamp.lua) sent when `floor` was had wrote the sender `stamp`, and
        found none below: the node's enqueues sent from now carry it, while that epoch lasts."""
        with self._lock:
            self._learn_sent(self._counter(endpoint, floor.at), endpoint, floor, stamp)

    def _learn_sent(self, counter: _Counter, endpoint: str, floor: Floor, stamp: int) -> None:
        if floor.stamp_epoch != self.epoch_of(endpoint):
            return  # (learned in an epoch that has ended)
        newer = (floor.key, stamp) > (counter.sent_key, counter.sent)
        if counter.sent_epoch != floor.stamp_epoch or newer:
            counter.sent, counter.sent_key = stamp, floor.key
            counter.sent_epoch, counter.sent_at = floor.stamp_epoch, floor.at

    def sent_judged(
        self, endpoint: str, floor: Floor, stamp: int, went_back: int | None
    ) -> Loss | None:
        """An enqueue sent when `floor` was had answered the sender `stamp` and, when it found
        it below `floor.stamp`, what it held (`went_back`; 0: gone): Redis lost or rolled back
        the data since this node's enqueue that read `floor.stamp`, a server time before the
        loss (the fence). The sign of a loss, or None: none, or one declared since that enqueue
        was sent (the epoch moved on: its key is not the node's any more), or with that fence
        or a higher one."""
        with self._lock:
            counter = self._counter(endpoint, floor.at)
            if went_back is None:
                self._learn_sent(counter, endpoint, floor, stamp)
                return None
            # (a loss declared now: the node's next enqueue writes a stamp afresh, to a key of
            # a new generation)
            if floor.stamp_epoch != self.epoch_of(endpoint) or floor.stamp <= self.fence_of(
                endpoint
            ):
                return None
        what = "is gone" if went_back == 0 else f"went back to {went_back}"
        reason = f"this node's sender stamp on {endpoint!r} was {floor.stamp} and {what}"
        return Loss(reason, self.scope_of(endpoint), floor.stamp)

    def mark(self, endpoint: str, now: float) -> CallMark:
        """A call on `endpoint` begins now."""
        with self._lock:
            floor = Floor(self._counter(endpoint, now).floor, self.epoch_of(endpoint))
            return CallMark(endpoint, floor.epoch, floor)

    def survives(self, mark: CallMark) -> bool:
        """Whether the call of `mark` goes on: no declaration covered its endpoint since it was
        last judged, or its request is numbered above the fence (queued after the loss), or it
        has not been enqueued yet (judged once its number is known)."""
        with self._lock:
            current = self.mark_of(mark.endpoint)
        if current.epoch == mark.epoch or mark.number is None:
            return True
        if mark.number > current.fence:
            mark.epoch = current.epoch
            return True
        return False

    def read(self, endpoint: str, floor: Floor, value: int, now: float) -> Loss | None:
        """A take's reading of the last sequence number (0: no counter), sent when `floor` was
        had: the sign of a loss it shows, or None (the reading is then learned)."""
        with self._lock:
            return self._judge(endpoint, self._counter(endpoint, now), floor, value, True)

    def declared_by_stamp(self, endpoint: str) -> None:
        """The loss a take's stamp showed was declared: the stamp that take wrote on the data
        Redis holds now belongs to the new epoch (a loss it shows next is a new one)."""
        with self._lock:
            counter = self._counters.get(endpoint)
            if counter is not None:
                counter.stamp_epoch = self.epoch_of(endpoint)

    def enqueued(
        self, endpoint: str, floor: Floor, before: int, number: int, now: float
    ) -> Loss | None:
        """An enqueue sent when `floor` was had gave its request `number`; the endpoint's last
        number before it was `before` (0: none). The sign of a loss `before` shows, or None."""
        with self._lock:
            counter = self._counter(endpoint, now)
            loss = self._judge(endpoint, counter, floor, before, True)
            if loss is None and floor.epoch == self.epoch_of(endpoint):
                counter.floor = max(counter.floor, number)
            return loss

    def handed_again(self, endpoint: str, number: int) -> int:
        """The fence for a hand-out this node took before, handed out again: a rollback no
        reading showed; what Redis holds was numbered up to the floor (which the take that
        brought it raised) or, at least, up to the hand-out's own number."""
        with self._lock:
            counter = self._counters.get(endpoint)
            return max(number, 0 if counter is None else counter.floor)

    def _judge(
        self, endpoint: str, counter: _Counter, floor: Floor, value: int, suspect: bool
    ) -> Loss | None:
        """Judge a reading (module docstring); with `suspect`, a counter gone that the node read
        lately makes it check at once. Call with the lock held."""
        if floor.epoch != self.epoch_of(endpoint):
            return None  # a declaration came since it was sent: it says nothing
        if value <= 0:
            # The floor stays: numbers come from the server's clock, so a counter written again
            # (an endpoint idle past its TTL used again, or after a flush) reads above it, and a
            # rollback that follows (a restart from an older snapshot) below it, whatever came
            # between. (Lowering it until the check below declared the flush left a window in
            # which such a rollback's ghosts ran.)
            if floor.value and counter.gone_at != counter.floor:
                counter.gone_at = counter.floor
                if suspect:
                    self.next_check = 0.0
                    self.wake()
            return None
        if value < floor.value:
            reason = f"sequence numbers of {endpoint!r} went back from {floor.value} to {value}"
            return Loss(reason, self.scope_of(endpoint), floor.value)
        counter.floor = max(counter.floor, value)
        return None

    def _counter(self, endpoint: str, now: float, *, used: bool = True) -> _Counter:
        """What is known of `endpoint`'s numbers (a use of it, unless not `used`); call with
        the lock held."""
        counter = self._counters.get(endpoint)
        if counter is None:
            counter = self._counters[endpoint] = _Counter(0, now)
        elif used:
            counter.used = max(counter.used, now)
        return counter
