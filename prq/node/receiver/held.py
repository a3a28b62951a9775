"""What a receiver holds: requests it took and has not answered, the markers of their large
bodies, and its memory of what it took and ran; and giving it all back on shutdown.

The state is typed here and built by `QueueBase.__init__`; the other receiver mixins
(signatures, taking, answering) build on this one.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from prq.core.bodies import parse as parse_body
from prq.core.errors import PrqError
from prq.core.lifecycle import PendingRequest
from prq.node.core import NodeCore
from prq.node.receiver.ran import RanRequests
from prq.node.receiver.taken import TakenRequests
from prq.protocol.effects import Exec, Flow
from prq.protocol.scripts.redelivery import Redelivery
from prq.protocol.scripts.take import hand_back_call, parse_unpark, unpark_call
from prq.protocol.signing import Renewals

logger = logging.getLogger(__name__)

__all__ = ["HeldRequests"]


class HeldRequests(NodeCore):
    """The requests a node holds, and giving them back (a mixin of `QueueBase`)."""

    #: Signed at_least_once requests this node holds, whose signatures it renews while
    #: it holds them, so that they can be handed out again however long it ran them.
    _renewals: Renewals
    #: Markers of the large bodies (prq.core.bodies) of held requests: deleted once answered.
    _held_bodies: dict[str, bytes]
    #: Requests this node took and has not answered: id → PendingRequest (owner token).
    _held: dict[str, PendingRequest]
    #: What this node took lately, by sequence number: a second hand-out of the same one
    #: can only come from a Redis that went back in time, and must not run
    #: (prq.node.receiver.taken).
    _taken: TakenRequests
    #: Numbers this node's takes in the order they are sent (TakenRequests.take).
    _take_serials: Iterator[int]
    #: at_least_once requests this node ran, and their answers (prq.node.receiver.ran).
    _ran: RanRequests
    #: Take tokens whose take failed on the client side (it may still run in Redis): the
    #: next take of the endpoint uses one, so what it was handed is collected, not orphaned.
    _spare_tokens: dict[str, list[str]]
    #: Take tokens that may be parked, or hold hand-offs this node never collected: token
    #: → endpoint, from the take's start until it returns (a take cut short by shutdown
    #: stays here, and closing withdraws its park and gives back what it was handed).
    _taking: dict[str, str]
    #: Ids of held requests a `serve` handler is working on (closing waits for these).
    _serving: set[str]

    def _held_data(self) -> list[str]:
        """Store references of the DataStreams and large bodies of the requests this node
        holds: they are kept for as long as it holds them (StreamKeeper.sweep)."""
        references = [
            stream.reference
            for pending in list(self._held.values())
            for stream in pending.request.streams.values()
            if stream.reference is not None
        ]
        markers = list(self._held_bodies.values())
        return references + [parse_body(marker).reference for marker in markers]

    def _serving_held(self) -> bool:
        """Whether a `serve` handler still works on a held request that can be answered (what
        closing waits for; a request dequeued by hand is given back at once)."""
        return any(
            (pending := self._held.get(request_id)) is not None and not pending.cancelled
            for request_id in list(self._serving)
        )

    def _hand_back_flow(self) -> Flow[int]:
        """On shutdown, give back every request still held: at_least_once ones are queued
        again for another receiver, at_most_once ones cancelled ("receiver_shutdown", their
        callers told at once). Their PendingRequests are cancelled ("shutdown"). The same for
        what was handed to a take cut short by the shutdown (its park is withdrawn first, so
        nothing more comes). How many."""
        uncollected = yield from self._unpark_flow(list(self._taking))
        held = list(self._held.values())
        if not held:
            return uncollected
        redelivery = Redelivery.of(self.settings, self.redis_settings)
        given = [(p.request.endpoint, p.id, p.owner_token) for p in held]
        calls = tuple(
            hand_back_call(self.keys.endpoint(endpoint), request_id, token, redelivery)
            for endpoint, request_id, token in given
        )
        replies = yield Exec(calls)
        assert isinstance(replies, list)
        for (_, request_id, _), reply in zip(given, replies, strict=True):
            state = reply.decode() if isinstance(reply, bytes) else str(reply)
            pending = self._held.pop(request_id, None)
            self._held_bodies.pop(request_id, None)  # queued again, or its caller deletes it
            logger.warning(
                "held request given back on shutdown request_id=%s collected=%s state=%s",
                request_id, pending is not None, state,
            )  # fmt: skip
            if pending is not None:
                pending.mark_cancelled("shutdown")
            self._watch.liveness.release(request_id)
        return uncollected + len(given)

    def _unpark_flow(self, tokens: list[str]) -> Flow[int]:
        """Withdraw the parks of takes that will never return what they got, in one round trip,
        and give that back (unpark.lua: it never ran, so it goes to another receiver, its
        attempt not counted); how many requests went back."""
        taking = [(t, endpoint) for t in tokens if (endpoint := self._taking.pop(t, None))]
        for token, endpoint in taking:  # never used again: its receipt goes
            # (a serve thread may pop it meanwhile, as a spare for its take: _take_token)
            with contextlib.suppress(ValueError):
                self._spare_tokens.get(endpoint, []).remove(token)
        if not taking:
            return 0
        redelivery = Redelivery.of(self.settings, self.redis_settings)
        calls = tuple(
            unpark_call(self.keys.endpoint(endpoint), token, redelivery)
            for token, endpoint in taking
        )
        try:
            replies = yield Exec(calls)
        except PrqError:
            # Kept, so that closing tries again; and, unless closing, spare: the endpoint's
            # next take collects what the token got (it never ran), as after a take that
            # failed, instead of leaving it taken by nobody until the caller's receiver
            # check gives up on it
            for token, endpoint in taking:
                self._taking.setdefault(token, endpoint)
                if not self._closing:
                    self._spare_tokens.setdefault(endpoint, []).append(token)
            raise
        assert isinstance(replies, list)
        given = sum(parse_unpark(reply) for reply in replies)
        if given:
            logger.info("requests handed to takes cut short given back count=%d", given)
        return given
