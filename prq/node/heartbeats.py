"""Liveness of in-flight requests: each node beats for what it sends and what it holds.

A request this node *sent* and still waits for, or *holds* (took, not yet answered), is a
`Lease`. Beats are Redis writes (beat.lua: a field in the request hash, on server time), not
pub/sub messages, so a lost pulse can never make a live node look dead; the other side judges
them when it polls (read_response.lua for the sender, beat.lua for the receiver).

Timeline of one lease:

    since ──(initial delay, 7 s)── first beat ──(every 15 s)── beat ── ... until released
    holder only: every poll interval, look whether the request was cancelled (same script,
    without recording a beat), so a cancel reaches the handler even if its pulse was lost

A call that ends before the initial delay and the first poll costs nothing here. Pure: the
facade's watch loop sends `due()`'s calls in one round trip and hands the replies to `settle()`.

A sender's lease begins before its enqueue is sent (so that no beat of a call can come late),
so its first beats may reach Redis before the request does (a first-beat delay of 0, or an
enqueue slowed by retries): until a beat has found the request, "missing" means "not written
yet", not "lost", and the lease goes on beating. (A request lost meanwhile is found missing by
its caller's own poll.) Ending the lease there would leave the caller waiting without beats,
and its receiver would cancel the request (sender_lost) one sender timeout after the take.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from prq.core.errors import PrqError
from prq.core.lifecycle import PendingRequest
from prq.protocol.effects import Call, Reply
from prq.protocol.flows.context import Context
from prq.protocol.scripts.liveness import beat_call, parse_beat

logger = logging.getLogger(__name__)

__all__ = ["Lease", "Liveness"]

#: A sender timeout that never fires (used for a turn that must not judge).
NO_JUDGMENT_MS = 10**12


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


@dataclass(slots=True)
class Lease:
    """One request in flight on this node, as a sender (`pending` None) or as its holder."""

    request_id: str
    endpoint: str
    since: float
    pending: PendingRequest | None = None
    last_beat: float | None = None
    last_look: float = field(default=0.0)
    #: The owner token the last holder's beat was sent with (a redelivery adopted by this node
    #: changes the pending's token: a "fenced" reply to the old one is then out of date).
    beat_token: str = ""
    #: Sender side: called with (bytes read, bytes in all) when the receiver's beats report
    #: new progress on the request's DataStreams.
    on_progress: Callable[[int, int], None] | None = None
    progress: tuple[int, int] | None = None
    #: Holder side: the request's sequence number on its endpoint (0: not known), which a
    #: declared data loss judges it by (prq.node.data_loss).
    sequence: int = 0
    #: Sender side: a beat found the request in Redis (before that, "missing" is an enqueue
    #: still on its way, not a loss).
    seen: bool = False

    def __post_init__(self) -> None:
        self.last_look = self.since


def _progress(pending: PendingRequest) -> str:
    """How far a held request's DataStreams were read, as beats carry it ("" for none)."""
    streams = pending.request.streams
    if not streams:
        return ""
    total = sum(stream.length or 0 for stream in streams.values())
    return f"{sum(stream.bytes_read for stream in streams.values())}/{total}"


def _report(lease: Lease, progress: tuple[int, int]) -> None:
    if lease.on_progress is None:
        return
    try:
        lease.on_progress(*progress)
    except Exception:
        logger.exception("on_progress raised request_id=%s", lease.request_id)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a beat learned about a lease: the request's state and why, if it ended."""

    lease: Lease
    state: str
    reason: str


class Liveness:
    """The leases of one node and which beats are due."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.sent: dict[str, Lease] = {}
        self.held: dict[str, Lease] = {}
        self.beats_sent = 0
        #: When Redis last answered this node's watch (monotonic); a holder judges senders only
        #: if it was itself in touch a moment ago (after a pause, everyone gets a turn first).
        self.last_contact = 0.0

    def send(
        self,
        request_id: str,
        endpoint: str,
        now: float,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.sent[request_id] = Lease(request_id, endpoint, now, on_progress=on_progress)

    def hold(self, pending: PendingRequest, now: float, sequence: int = 0) -> None:
        self.held[pending.id] = Lease(
            pending.id, pending.request.endpoint, now, pending, sequence=sequence
        )

    def beat_soon(self, request_id: str, now: float) -> None:
        """Beat for a held request at the next turn (its owner token changed)."""
        lease = self.held.get(request_id)
        if lease is not None:
            lease.since = now - self.ctx.settings.heartbeat_initial_delay_s
            lease.last_beat = None

    def release(self, request_id: str) -> None:
        self.sent.pop(request_id, None)
        self.held.pop(request_id, None)

    def _beat_due(self, lease: Lease, now: float) -> bool:
        settings = self.ctx.settings
        if now - lease.since < settings.heartbeat_initial_delay_s:
            return False
        return lease.last_beat is None or now - lease.last_beat >= settings.heartbeat_interval_s

    def due(self, now: float) -> list[tuple[Lease, Call]]:
        """The beats (and holders' looks) due now, one call each."""
        settings = self.ctx.settings
        keys = self.ctx.keys
        calls: list[tuple[Lease, Call]] = []
        in_flight_ttl_ms = _ms(settings.in_flight_ttl_s())
        list_ttl_ms = _ms(settings.list_ttl_s)
        # (snapshots: a blocking node's worker threads hold and release requests meanwhile)
        for lease in list(self.sent.values()):
            if self._beat_due(lease, now):
                lease.last_beat = now
                call = beat_call(
                    keys.endpoint(lease.endpoint), lease.request_id, "s", "", True,
                    0, in_flight_ttl_ms, list_ttl_ms,
                )  # fmt: skip
                calls.append((lease, call))
        in_touch = now - self.last_contact <= 2 * settings.poll_interval_s + 1.0
        sender_timeout_ms = _ms(settings.sender_timeout_s) if in_touch else NO_JUDGMENT_MS
        for lease in list(self.held.values()):
            record = self._beat_due(lease, now)
            if not record and now - lease.last_look < settings.poll_interval_s:
                continue
            # looks stay on a fixed grid, so a slow turn does not push every later look back
            behind = (now - lease.last_look) // settings.poll_interval_s
            lease.last_look += max(1.0, behind) * settings.poll_interval_s
            if record:
                lease.last_beat = now
            assert lease.pending is not None
            lease.beat_token = lease.pending.owner_token
            call = beat_call(
                keys.endpoint(lease.endpoint), lease.request_id, "r",
                lease.pending.owner_token, record, sender_timeout_ms,
                in_flight_ttl_ms, list_ttl_ms,
                _progress(lease.pending),
            )  # fmt: skip
            calls.append((lease, call))
        self.beats_sent += len(calls)
        return calls

    def settle(self, leases: list[Lease], replies: list[Reply]) -> list[Verdict]:
        """Read the beats' replies; return the leases whose request is no longer in flight."""
        ended: list[Verdict] = []
        for lease, reply in zip(leases, replies, strict=True):
            if isinstance(reply, Exception):
                continue
            try:
                state, reason, progress = parse_beat(reply)
            except PrqError as exc:
                logger.warning(
                    "unreadable beat reply request_id=%s error=%s", lease.request_id, exc
                )
                continue
            if progress is not None and progress != lease.progress:
                lease.progress = progress
                _report(lease, progress)
            if state in ("taken", "queued"):
                lease.seen = True
                continue
            if state == "missing":
                if lease.pending is None and not lease.seen:
                    continue  # the caller's enqueue has not reached Redis yet
                reason = "data_loss"
            elif state == "fenced":
                if lease.pending is not None and lease.pending.owner_token != lease.beat_token:
                    continue  # the request was adopted again meanwhile, under a new token
                reason = "fenced"
            ended.append(Verdict(lease, state, reason or state))
        return ended

    def next_due_in(self, now: float) -> float:
        """Seconds until the watch loop should look again (bounded by the poll interval)."""
        settings = self.ctx.settings
        wait = settings.poll_interval_s
        for lease in (*self.sent.values(), *self.held.values()):
            start = lease.since + settings.heartbeat_initial_delay_s
            beat_at = (
                start
                if lease.last_beat is None
                else lease.last_beat + (settings.heartbeat_interval_s)
            )
            wait = min(wait, beat_at - now)
            if lease.pending is not None:
                wait = min(wait, lease.last_look + settings.poll_interval_s - now)
        return max(0.01, wait)
