"""One node of the queue, as both facades share it: its state built, its halves joined.

`QueueBase` is the node's core (prq.node.core: identity, settings, keys) with its sender half
(prq.node.sender: the requests it sends, whose leases live in the watch's liveness) and its
receiver half (prq.node.receiver: the requests it took and has not answered, `_held`: id →
PendingRequest with the owner token that answering needs). Nothing here does I/O: `AsyncQueue`
(prq.facade.asyncio_queue) and `Queue` (prq.facade.blocking_queue) add the I/O path, driving the
flows of prq.protocol.flows and owning the connections.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Self

from prq.core.config import QueueSettings, RedisSettings
from prq.core.keys import KeySchema
from prq.node.receiver.answering import Answerer
from prq.node.receiver.ran import RanRequests
from prq.node.receiver.taken import TakenRequests
from prq.node.receiver.taking import Taker
from prq.node.sender import SenderHalf
from prq.protocol.flows.context import Context
from prq.protocol.signing import Renewals, Signer
from prq.protocol.stream_keeper import StreamKeeper
from prq.transport.topology import is_cluster_url

if TYPE_CHECKING:
    from prq.datastreams import DataStreamStore

__all__ = ["SHUTDOWN_POLL_S", "QueueBase", "QueueStats"]

#: How often closing looks whether the held requests were answered (seconds).
SHUTDOWN_POLL_S = 0.02


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Client-side counters of one node (for tests, benchmarks and metrics)."""

    redis_commands: int
    round_trips: int
    redis_retries: int
    subscriptions: int
    pubsub_reconnects: int
    pulses_received: int
    held_requests: int
    heartbeats_sent: int = 0
    data_loss_events: int = 0


class QueueBase(SenderHalf, Taker, Answerer):
    """What both facades share: settings, keys, node identity, and pure request handling."""

    @classmethod
    def from_url(
        cls,
        url: str | None = None,
        *,
        prefix: str = "prq",
        settings: QueueSettings | None = None,
        datastreams: DataStreamStore | None = None,
        redis_settings: RedisSettings | None = None,
    ) -> Self:
        """A queue on the Redis at `url` (None reads PRQ_REDIS_URL, or takes
        `redis_settings.url`), with the timings of `settings` and the connection settings of
        `redis_settings` (timeouts, pool size, TLS files); a `url` given beside
        `redis_settings` replaces its URL."""
        if redis_settings is None:
            redis_settings = RedisSettings.from_url(url)
        else:
            redis_settings = redis_settings.with_url(url)
        return cls(redis_settings, prefix=prefix, settings=settings, datastreams=datastreams)

    @property
    def stats(self) -> QueueStats:
        return QueueStats(
            redis_commands=self._io.commands,
            round_trips=self._io.round_trips,
            redis_retries=self._io.retries,
            subscriptions=self._pulses.subscriptions,
            pubsub_reconnects=self._pulses.reconnects,
            pulses_received=self._router.messages,
            held_requests=len(self._held),
            heartbeats_sent=self._watch.liveness.beats_sent,
            data_loss_events=self._watch.data_loss.events,
        )

    def __init__(
        self,
        redis_settings: RedisSettings,
        *,
        prefix: str = "prq",
        settings: QueueSettings | None = None,
        datastreams: DataStreamStore | None = None,
        node_id: str | None = None,
    ) -> None:
        """Build the node's state: each part is typed, and described, where it is declared
        (prq.node.core, prq.node.receiver.held)."""
        self.redis_settings = redis_settings
        self.settings = settings or QueueSettings()
        self.keys = KeySchema(prefix, sharded=is_cluster_url(redis_settings.url))
        self.node_id = node_id or uuid.uuid4().hex[:16]
        self.datastreams = datastreams
        self._streams = StreamKeeper(datastreams, self.settings, held=self._held_data)
        self.ctx = Context(
            self.keys,
            self.settings,
            self.node_id,
            signer=Signer.from_settings(self.settings),
            bodies=self._streams,
            redis=redis_settings,
        )
        self._renewals = Renewals(
            self.settings.heartbeat_initial_delay_s, self.settings.signature_renewal_s()
        )
        self._held_bodies = {}
        self._held = {}
        self._taken = TakenRequests()
        self._take_serials = itertools.count(1)
        self._ran = RanRequests()
        self._spare_tokens = {}
        self._layout_checked = set()
        self._taking = {}

        self._closed = False
        self._closing = False
        self._serving = set()
