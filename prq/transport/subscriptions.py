"""Subscriptions: what both pub/sub readers (prq.transport.pulses) keep, without doing I/O.

The channels a reader wants and those Redis confirmed, the health of its link (ping after a
silence, reconnect after a longer one, back off with jitter after a loss), and the handling of
each raw reply: messages go to the router (prq.transport.pulse_router), and after a reconnect
every signal fires so that all waits poll at once, since pulses may have been lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Generic

from prq.core.jitter import jitter
from prq.transport.pulse_router import PulseRouter
from prq.transport.signals import S

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_SUBSCRIBE_CONFIRM_S", "PulsesBase"]


#: How long a subscribe waits for Redis to confirm before relying on polling alone.
DEFAULT_SUBSCRIBE_CONFIRM_S = 2.0
#: Silence on the pub/sub link after which the reader pings Redis.
DEFAULT_PING_AFTER_S = 5.0
#: Silence (no message, no pong) after which the link is presumed dead and reconnected.
DEFAULT_DEAD_AFTER_S = 15.0
#: Largest pause between reconnect attempts.
DEFAULT_RECONNECT_MAX_S = 2.0


class _Subscriber(Generic[S]):
    """What both readers share: wanted and confirmed channels, link health, message handling.

    Pure: the readers do the I/O and call `handle` with each raw reply of the connection.
    """

    def __init__(self, router: PulseRouter[S], *, sharded: bool = False) -> None:
        self.router: PulseRouter[S] = router
        #: A shard's reader (SSUBSCRIBE) starts with no channel; the one reader of a server
        #: starts with the node's channel.
        self.desired: set[str] = set() if sharded else {router.node_channel.decode()}
        self.confirmed: set[str] = set()
        self.command = "SSUBSCRIBE" if sharded else "SUBSCRIBE"
        #: Called when a link is lost, and with a channel the server unsubscribed (its slot
        #: moved to another master): a sharded reader's owner routes its channels again.
        self.on_lost: Callable[[], None] = lambda: None
        self.on_moved: Callable[[str], None] = lambda channel: None
        self.recovering = False
        self.reconnects = 0
        self._last_seen = time.monotonic()
        self._pinged = False

    def handle(self, reply: object) -> str | None:
        """Dispatch one reply; return the channel it confirms, if it is a subscribe reply."""
        self._last_seen = time.monotonic()
        self._pinged = False
        if not isinstance(reply, list) or len(reply) < 2:
            return None
        kind = reply[0]
        if kind in (b"message", b"smessage") and len(reply) == 3:
            channel, data = reply[1], reply[2]
            if isinstance(channel, bytes) and isinstance(data, bytes):
                self.router.dispatch(channel, data)
        elif kind == b"sunsubscribe" and isinstance(reply[1], bytes):
            moved = reply[1].decode()
            self.confirmed.discard(moved)
            self.desired.discard(moved)
            self.on_moved(moved)
        elif kind in (b"subscribe", b"ssubscribe") and isinstance(reply[1], bytes):
            channel_name = reply[1].decode()
            self.confirmed.add(channel_name)
            if self.recovering:
                self.recovering = False
                self.router.reconnected()
            return channel_name
        return None

    def next_action(self) -> str | None:
        """After a quiet read: "ping" the link, "reconnect" a silent one, or nothing."""
        silent = time.monotonic() - self._last_seen
        if silent > DEFAULT_DEAD_AFTER_S:
            return "reconnect"
        if silent > DEFAULT_PING_AFTER_S and not self._pinged:
            self._pinged = True
            return "ping"
        return None

    def lost(self, exc: BaseException, failures: int) -> float:
        """Note a lost link; return how long to back off before reconnecting."""
        level = logging.WARNING if failures == 1 else logging.DEBUG
        logger.log(level, "pub/sub link lost error=%s failures=%d", exc, failures)
        self.reconnects += 1
        self.confirmed.clear()
        self.recovering = True
        self.router.wake_all()  # pulses may have been lost: every wait polls now
        self._last_seen = time.monotonic()
        self.on_lost()
        return float(min(DEFAULT_RECONNECT_MAX_S, 0.05 * 2 ** min(failures, 10)) * jitter())


class PulsesBase:
    """What both readers report: how many channels they hold and how often they reconnected."""

    _state: _Subscriber[Any]

    @property
    def subscriptions(self) -> int:
        return len(self._state.desired)

    @property
    def reconnects(self) -> int:
        return self._state.reconnects

    @property
    def links(self) -> int:
        """Pub/sub connections held: one (on a cluster, one per master:
        prq.transport.shard_pulses)."""
        return 1
