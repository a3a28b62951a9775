"""The pulse router: which signal a pub/sub message fires, and how node messages are framed.

A node subscribes to its own channel (responses for the requests it sent) and to the pulse
channel of each endpoint it dequeues from; never one channel per request. Node channel messages
are `r|<request id>|<response JSON or empty>`; an empty response means "it is stored, read it".
Several of them for one node, answered in one step, travel as one message
`m|<len>|<message><len>|<message>...` (each with its length in bytes before it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Generic

from prq.transport.signals import S

__all__ = ["PulseRouter", "unframe"]


#: Most messages one framed pulse may carry (a bound on the parse of a hostile message).
MAX_FRAMED = 100_000


def unframe(data: bytes) -> Iterator[bytes]:
    """The messages of a framed pulse's body (`<len>|<message><len>|<message>...`); a damaged
    frame ends the iteration (what came before it is kept: pulses are hints, polls find the
    rest)."""
    at, end = 0, len(data)
    for _ in range(MAX_FRAMED):
        if at >= end:
            return
        bar = data.find(b"|", at, at + 12)
        if bar < 0:
            return
        size = data[at:bar]
        if not size.isdigit():
            return
        at = bar + 1 + int(size)
        if at > end:
            return
        yield data[bar + 1 : at]


class PulseRouter(Generic[S]):
    """Maps channels, request ids and take tokens to signals; pure, shared by both readers.

    Node channel messages: `r|<id>|<response or empty>` (a response), `t|<token>|<id>` (a
    hand-off), `c|<id>|<reason>` (a held request was cancelled), `m|...` (several of those,
    framed: `unframe`). Each waiting take has its own
    signal: an endpoint pulse fires the signals of every take waiting on that endpoint; a
    hand-off fires only the signal of its token (the take then collects and so confirms it).
    """

    def __init__(self, node_channel: str, make_signal: Callable[[], S]) -> None:
        self.node_channel = node_channel.encode()
        #: On a cluster the node's channels are one per endpoint, `<endpoint tag>:n:<node>`
        #: (keys.EndpointKeys.node_channel): recognised by this ending.
        self._node_suffix = b":n:" + self.node_channel.rpartition(b":")[2]
        self._make = make_signal
        self._takes: dict[bytes, dict[str, S]] = {}
        self._tokens: dict[str, S] = {}
        self._responses: dict[str, S] = {}
        self.messages = 0
        #: Called with (request id, reason) for a `c|<id>|<reason>` pulse (a cancel after pickup).
        self.on_cancel: Callable[[str, str], None] | None = None
        #: Called when the pub/sub link is back after it was lost: Redis may have restarted,
        #: so the node checks for data loss at once (prq.node.data_loss).
        self.on_reconnected: Callable[[], None] | None = None

    @contextlib.contextmanager
    def watch_response(self, request_id: str) -> Iterator[S]:
        """A signal for one request's response, registered for the duration of the block."""
        signal = self._make()
        self._responses[request_id] = signal
        try:
            yield signal
        finally:
            if self._responses.get(request_id) is signal:
                del self._responses[request_id]

    @contextlib.contextmanager
    def watch_take(self, channel: str, token: str) -> Iterator[S]:
        """A signal for one take: fired by the endpoint's pulses and by hand-offs to `token`."""
        signal = self._make()
        waiting = self._takes.setdefault(channel.encode(), {})
        waiting[token] = signal
        self._tokens[token] = signal
        try:
            yield signal
        finally:
            waiting.pop(token, None)
            self._tokens.pop(token, None)

    @property
    def watched_responses(self) -> int:
        return len(self._responses)

    def dispatch(self, channel: bytes, data: bytes) -> None:
        self.messages += 1
        if channel != self.node_channel and not channel.endswith(self._node_suffix):
            for signal in list(self._takes.get(channel, {}).values()):
                signal.fire()
            return
        kind, _, rest = data.partition(b"|")
        if kind == b"m":
            for message in unframe(rest):
                self._dispatch_node(message)
            return
        self._dispatch_node(data)

    def _dispatch_node(self, data: bytes) -> None:
        kind, _, rest = data.partition(b"|")
        key, _, payload = rest.partition(b"|")
        name = key.decode("ascii", errors="replace")
        if kind == b"r":
            response_signal = self._responses.get(name)
            if response_signal is not None:
                response_signal.fire(payload or None)
        elif kind == b"t":
            take_signal = self._tokens.get(name)
            if take_signal is not None:
                take_signal.fire()
        elif kind == b"c" and self.on_cancel is not None:
            self.on_cancel(name, payload.decode("ascii", errors="replace"))

    def poke_response(self, request_id: str) -> None:
        """Wake the wait for one response so that it reads Redis now."""
        signal = self._responses.get(request_id)
        if signal is not None:
            signal.fire()

    def reconnected(self) -> None:
        """The pub/sub link is back after it was lost: pulses may have been lost meanwhile
        (every wait polls now), and Redis may have restarted."""
        self.wake_all()
        if self.on_reconnected is not None:
            self.on_reconnected()

    def wake_all(self) -> None:
        """Fire every signal (after a reconnect, when pulses may have been lost, and when data
        loss is declared). Takes and calls begin and end on other threads meanwhile (a blocking
        node's callers and serve threads), so each table is copied in one step (`list()` of a
        dict's values) before anything is fired: a Python loop over a table that another
        thread changes raises RuntimeError, which would end the pub/sub reader thread, or the
        watch thread and with it every heartbeat."""
        signals = list(self._responses.values())
        for waiting in list(self._takes.values()):
            signals += list(waiting.values())
        for signal in signals:
            signal.fire()
