"""The core of a node, which its sender and receiver halves share: identity, settings, keys,
the protocol context, its DataStreams and large bodies, whether it is closing, and the checks
made before talking to Redis (the server's configuration, an endpoint's scheduling layout, a
body's size).

`QueueBase` (prq.node.base) builds this state; the halves (prq.node.sender, prq.node.receiver)
read it. Nothing here does I/O, and nothing here knows either half.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prq.core.config import QueueSettings, RedisSettings
from prq.core.errors import PrqError
from prq.core.keys import KeySchema
from prq.core.models import check_body_size
from prq.node.watch import NodeWatch
from prq.protocol.effects import Call, Flow, Reply
from prq.protocol.flows.context import Context
from prq.protocol.flows.layout import layout_flow
from prq.protocol.health import INFO_CALLS
from prq.protocol.stream_keeper import StreamKeeper
from prq.transport.batches import IOCounters
from prq.transport.pulse_router import PulseRouter
from prq.transport.subscriptions import PulsesBase

if TYPE_CHECKING:
    from prq.datastreams import DataStreamStore

__all__ = ["NodeCore"]


class NodeCore:
    """A node's identity, settings and shared state, typed (set by `QueueBase.__init__` and,
    for the I/O parts, by the facade), and the checks both halves make."""

    redis_settings: RedisSettings
    settings: QueueSettings
    keys: KeySchema
    node_id: str
    datastreams: DataStreamStore | None
    #: The DataStreams and large bodies of what this node sends and receives
    #: (prq.protocol.stream_keeper).
    _streams: StreamKeeper
    ctx: Context
    #: Endpoints this node took from or sent to after checking they hold no previous-layout
    #: lanes.
    _layout_checked: set[str]
    _closed: bool
    #: Closing began: new calls and takes are refused, answers still go out.
    _closing: bool

    # Set by the facade, which owns the I/O.
    _io: IOCounters
    _pulses: PulsesBase
    _router: PulseRouter[Any]
    _watch: NodeWatch

    @property
    def closed(self) -> bool:
        """True once closing began: no new calls or takes (held requests are still answered
        until the shutdown timeout)."""
        return self._closing or self._closed

    # -- checking the server at start --------------------------------------------------------

    @staticmethod
    def _server_check_steps() -> list[list[Call]]:
        """INFO, read at start to judge the server's configuration (one step)."""
        return [[Call(args) for args in INFO_CALLS]]

    def _server_checked(self, info: list[Reply] | PrqError) -> None:
        """Warn loudly when Redis evicts keys or persists data (see prq.protocol.health); the watch
        re-reads INFO at every data-loss check and warns again only about what is new."""
        self._watch.server_checked(info)

    @property
    def redis_warnings(self) -> list[str]:
        """Why this Redis would defeat prq's guarantees (eviction, persistence), as last read."""
        return list(self._watch.server_warnings)

    # -- checks both halves make --------------------------------------------------------------

    def _check_size(self, body: bytes, what: str, request_id: str) -> None:
        check_body_size(body, self.settings.max_body_bytes, what, request_id)

    def _check_layout_flow(self, endpoint: str) -> Flow[None]:
        """Once per endpoint (until it passes): refuse one that holds the previous scheduling
        layout (flows.layout_flow; ConfigurationError)."""
        if endpoint not in self._layout_checked:
            yield from layout_flow(self.ctx, endpoint)
            self._layout_checked.add(endpoint)
