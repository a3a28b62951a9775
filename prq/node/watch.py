"""The node's watch: one loop that beats for in-flight requests and checks for data loss.

Each turn the facade asks `plan()` for what is due (beats, holders' cancellation looks, a
data-loss check), sends it as independent steps in one round trip, and gives the results to
`settle()`, which acts on them: a held request that was cancelled (or whose sender was lost, or
that Redis lost) gets its PendingRequest cancelled; a sent request that ended wakes its caller;
a data-loss sign starts a new epoch. A failed turn (Redis away) is simply tried again next turn,
so heartbeats resume by themselves after a blip. Pure; the facades own the loop (an asyncio task
or a daemon thread).

Between turns the loop sleeps `wait_s()`, until the next thing due or a `wake()`. A lease begun
meanwhile whose first beat is due before the loop would wake by itself (a first-beat delay
shorter than the poll interval) wakes it: that beat must not wait for the sleep to end, or the
other side, judging silence from the take, could declare a live node lost before it first beat.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prq.core.errors import PrqError
from prq.core.lifecycle import PendingRequest
from prq.node.data_loss.checks import Check
from prq.node.data_loss.counters import CallMark, CallStamps, Floor
from prq.node.data_loss.scopes import Layout, Loss
from prq.node.data_loss.watch import DataLossWatch
from prq.node.heartbeats import Lease, Liveness
from prq.observe import metrics
from prq.protocol.effects import Call, Reply
from prq.protocol.flows.context import Context
from prq.protocol.health import INFO_CALLS, parse_info, redis_warnings
from prq.protocol.presence import Presence
from prq.transport.pulse_router import PulseRouter

logger = logging.getLogger(__name__)

__all__ = ["NodeWatch", "WatchPlan"]


@dataclass(slots=True)
class WatchPlan:
    """One turn's work: a step per beat, then (maybe) the data-loss check as one step."""

    beats: list[Lease] = field(default_factory=list)
    check: Check | None = None
    #: The presence report rides with the check (its replies are not read).
    presence: bool = False
    #: INFO, re-read with each data-loss check: the step's index, or None.
    server_step: int | None = None
    steps: list[list[Call]] = field(default_factory=list)


class NodeWatch:
    """Liveness and data-loss bookkeeping of one node."""

    def __init__(
        self, ctx: Context, router: PulseRouter[Any], layout: Callable[[], Layout] = lambda: None
    ) -> None:
        self.liveness = Liveness(ctx)
        self.data_loss = DataLossWatch(ctx, layout)
        self.presence = Presence(ctx.keys, ctx.settings, ctx.node_id)
        #: Why Redis would defeat prq's guarantees, as last read from INFO (prq.protocol.health).
        self.server_warnings: list[str] = []
        #: Wakes the facade's watch loop for a turn now (set by the facade).
        self.wake: Callable[[], None] = lambda: None
        self.data_loss.wake = lambda: self.wake()
        self.router = router
        router.on_cancel = self.cancelled_by_pulse
        router.on_reconnected = self.data_loss.check_soon
        #: When the facade's loop wakes by itself next (monotonic seconds; infinite while it
        #: works out how long to sleep): a lease due for a beat before then wakes it.
        self._asleep_until = 0.0
        self._first_beat_s = ctx.settings.heartbeat_initial_delay_s

    @property
    def epoch(self) -> int:
        return self.data_loss.epoch

    def mark(self, endpoint: str) -> CallMark:
        """A call on `endpoint` begins now: it fails with DataLoss if a loss is declared
        there before it ends, unless its request is numbered above the fence (`survives`)."""
        return self.data_loss.mark(endpoint, time.monotonic())

    def survives(self, mark: CallMark) -> bool:
        return self.data_loss.survives(mark)

    def stamps(self, mark: CallMark) -> CallStamps:
        """The node's stamp on the endpoint of the call of `mark`, as its enqueue carries it."""
        return CallStamps(self.data_loss, mark)

    def plan(self, now: float, *, check_only: bool = False) -> WatchPlan:
        """What is due now; with `check_only`, just a data-loss check (whether due or not)."""
        plan = WatchPlan()
        if not check_only:
            for lease, call in self.liveness.due(now):
                plan.beats.append(lease)
                plan.steps.append([call])
        if check_only or self.data_loss.check_due(now):
            plan.check = self.data_loss.check(now, self._in_flight())
            plan.steps.append(plan.check.calls)
            if not check_only:
                plan.server_step = len(plan.steps)
                plan.steps.append([Call(args) for args in INFO_CALLS])
        if not check_only and self.presence.due(now):
            report = self.presence.calls(now)
            if report:
                plan.presence = True
                plan.steps.append(report)
        return plan

    def settle(self, plan: WatchPlan, results: list[list[Reply] | PrqError], now: float) -> None:
        if any(not isinstance(result, PrqError) for result in results):
            self.liveness.last_contact = now
        beat_replies: list[Reply] = [
            result if isinstance(result, PrqError) else result[0]
            for result in results[: len(plan.beats)]
        ]
        for verdict in self.liveness.settle(plan.beats, beat_replies):
            if verdict.state == "missing":  # its record is gone: a loss, or what else?
                self.data_loss.check_soon()
            self._ended(verdict.lease, verdict.reason)
        if plan.server_step is not None:
            self.server_checked(results[plan.server_step])
        if plan.check is not None:
            check = results[len(plan.beats)]
            if isinstance(check, PrqError):
                logger.debug("data-loss check failed error=%s", check)
                self.data_loss.forget(plan.check)
                return
            loss = self.data_loss.settle(plan.check, check, now)
            if loss:
                self.declare_data_loss(loss)

    def forget(self, plan: WatchPlan) -> None:
        """A plan whose steps got no reply at all (the round trip failed)."""
        if plan.check is not None:
            self.data_loss.forget(plan.check)

    def server_checked(self, info: list[Reply] | PrqError) -> None:
        """Judge an INFO reading; log each warning once, when it first appears (loudly: a
        Redis that evicts or persists defeats what prq promises)."""
        if isinstance(info, PrqError):
            logger.info("could not read Redis INFO to check its configuration: %s", info)
            return
        warnings = redis_warnings(parse_info(*info))
        for warning in warnings:
            if warning not in self.server_warnings:
                logger.warning("redis configuration defeats prq's guarantees: %s", warning)
        self.server_warnings = warnings

    def _ended(self, lease: Lease, reason: str) -> None:
        self.liveness.release(lease.request_id)
        if lease.pending is not None:
            logger.info("held request ended request_id=%s reason=%s", lease.request_id, reason)
            if reason == "sender_lost":
                metrics.HEARTBEATS_MISSED.labels(lease.pending.request.endpoint, "sender").inc()
            lease.pending.mark_cancelled(reason)
        else:
            self.router.poke_response(lease.request_id)  # its caller reads the outcome now

    def cancelled_by_pulse(self, request_id: str, reason: str) -> None:
        """A `c|<id>|<reason>` pulse: the request this node holds was cancelled."""
        lease = self.liveness.held.get(request_id)
        if lease is not None:
            self._ended(lease, reason or "cancelled")

    def enqueued(
        self,
        mark: CallMark,
        number: int | None,
        before: int,
        stamp: int = 0,
        went_back: int | None = None,
        refused: bool = False,
    ) -> None:
        """The enqueue of the call of `mark` answered: its request got `number` (None: the id
        was known, nothing enqueued) and the endpoint's last number before was `before`; the
        node's stamp is `stamp` after it, and `went_back` what the stamp held when that was
        below the one the enqueue carried (a loss is declared); `refused`: it wrote nothing
        (sent again, it found the stamp low: the call fails)."""
        if stamp or went_back is not None:
            loss = self.data_loss.sent_judged(mark.endpoint, mark.floor, stamp, went_back)
            if loss is not None:
                self.declare_data_loss(loss)
        if refused:
            return
        if number is None:
            mark.number = 0  # (the record's number is not known: a declaration fails the call)
            return
        mark.number = number
        now = time.monotonic()
        loss = self.data_loss.enqueued(mark.endpoint, mark.floor, before, number, now)
        if self.presence.sent(mark.endpoint, now):
            self.wake()
        if loss is not None:
            self.declare_data_loss(loss)

    def judge_stamp(self, endpoint: str, floor: Floor, stamp: int, went_back: int | None) -> bool:
        """A step sent when `floor` was had answered the node's `stamp` on `endpoint` (take.lua,
        enqueue.lua) and, when it found it below `floor.stamp`, what it held (`went_back`):
        declares the loss that shows (DataLossWatch.stamped). Whether it declared one."""
        loss = self.data_loss.stamped(endpoint, floor, stamp, went_back)
        if loss is None:
            return False
        self.declare_data_loss(loss)
        self.data_loss.declared_by_stamp(endpoint)
        return True

    def declare_data_loss(self, loss: Loss) -> None:
        """Data was lost in `loss.slots` (None: everywhere): the requests held there that are
        numbered at or below the fence (or not known) are cancelled; the others look at their
        records at the next turn, which starts now, and every waiting caller looks whether its
        call is one of those that fail."""
        self.data_loss.declare(loss)
        now = time.monotonic()
        for lease in list(self.liveness.held.values()):
            if not self.data_loss.covers(lease.endpoint, loss.slots):
                continue
            if lease.sequence <= self.data_loss.fence_of(lease.endpoint):
                self._ended(lease, "data_loss")
            else:
                lease.last_look = now - self.liveness.ctx.settings.poll_interval_s
        self.router.wake_all()
        self.wake()

    def hold(self, pending: PendingRequest, now: float, sequence: int = 0) -> None:
        """A request this node took (numbered `sequence` on its endpoint, 0: not known): beat
        for it from `heartbeat_initial_delay_s` on."""
        self.liveness.hold(pending, now, sequence)
        self._beat_due_at(now + self._first_beat_s)

    def send(
        self,
        request_id: str,
        endpoint: str,
        now: float,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> None:
        """A request this node sent and waits for: beat for it from the first-beat delay on."""
        self.liveness.send(request_id, endpoint, now, on_progress)
        self._beat_due_at(now + self._first_beat_s)

    def beat_soon(self, request_id: str, now: float) -> None:
        """Beat for a held request now (a redelivery of it was adopted, under a new owner
        token whose receiver timeout runs from now)."""
        self.liveness.beat_soon(request_id, now)
        self._beat_due_at(now)

    def _beat_due_at(self, at: float) -> None:
        """Wake the loop if a beat is due at `at`, before it would wake by itself."""
        if at < self._asleep_until:
            self.wake()

    def _in_flight(self) -> set[str]:
        """Endpoints this node has requests in flight on (sent or held): their sequence numbers
        stay watched however long ago the node last enqueued or took there."""
        leases = [*self.liveness.sent.values(), *self.liveness.held.values()]
        return {lease.endpoint for lease in leases}

    def wait_s(self, now: float) -> float:
        """How long the loop may sleep before its next turn (the loop sleeps that long unless
        woken). A lease taken while this is worked out wakes the loop (the sleep it is about
        to start may not count it)."""
        self._asleep_until = math.inf
        wait = max(
            0.01,
            min(
                self.liveness.next_due_in(now),
                self.data_loss.next_check - now,
                self.presence.next_report - now,
            ),
        )
        self._asleep_until = now + wait
        return wait
