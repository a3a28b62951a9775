"""Reading the outcomes of detached requests (OutcomeReading): where each stands, with its
response once it has one, the overdue withdrawn and the silent receivers' requests declared
lost as a waiting caller would; and the loss watch (LossWatch) that tells a record lost from one
expired."""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from prq.bulk.base import BulkBase
from prq.core import bodies
from prq.core.errors import PrqError
from prq.core.keys import EndpointKeys
from prq.core.models import Response
from prq.core.names import validate_endpoint
from prq.protocol.effects import Call
from prq.protocol.outcomes import open_response, resolve, response_of
from prq.protocol.scripts.liveness import canary_call, parse_canary
from prq.protocol.scripts.redelivery import Redelivery
from prq.protocol.scripts.replies import RequestSnapshot
from prq.protocol.scripts.request_state import (
    MAX_READ_IDS,
    parse_snapshots,
    parse_withdraw,
    read_response_call,
    withdraw_call,
)

__all__ = ["LOSS_WATCH_TTL_S", "LossWatch", "OutcomeReading"]

#: How long a loss watch outlives its last read.
LOSS_WATCH_TTL_S = 3600.0


@dataclass(slots=True)
class LossWatch:
    """Tells a reader of outcomes whether Redis lost data while it waited, so that a request
    whose record is missing is known lost (DataLoss) rather than expired.

    A counter beside the endpoint's records (prq:{e}:lw:<token>), stepped by the same script
    as a node's data-loss canary (scripts/canary.lua) with every read of outcomes
    (`BulkClient.outcomes(..., watch=)`), after the records: a value that is not the last one
    plus one means the key was lost or went back (a restart without persistence, a flush, a
    failover to a replica that missed writes). A read sent again (a lost reply, a script cache
    reloaded) finds the step already taken, so a replay never hides a loss nor invents one.
    Start it (`BulkClient.start_watch`) before sending what it watches; it lives an hour past
    its last read.
    """

    token: str = field(default_factory=lambda: secrets.token_urlsafe(8))
    #: The counter's value at the last read (None: not started).
    count: int | None = None
    #: Redis lost data since the watch started (stays True).
    lost: bool = False

    def saw(self, value: int) -> None:
        """Take the counter's value a read returned."""
        if self.count is not None and value != self.count + 1:
            self.lost = True
        if not self.lost:
            self.count = value


class OutcomeReading(BulkBase):
    """How a BulkClient reads outcomes, and a loss watch with them."""

    def start_watch(self, endpoint: str, watch: LossWatch) -> None:
        """Start `watch` on `endpoint` (one round trip), before sending what it watches."""
        keys = self.keys.endpoint(validate_endpoint(endpoint))
        watch.saw(parse_canary(self._io.execute([self._watch_call(keys, watch)])[0]))

    @staticmethod
    def _watch_call(keys: EndpointKeys, watch: LossWatch) -> Call:
        ttl_ms = int(LOSS_WATCH_TTL_S * 1000)
        return canary_call(keys.loss_watch(watch.token), ttl_ms, watch.count)

    def outcomes(
        self, endpoint: str, request_ids: Sequence[str], *, watch: LossWatch | None = None
    ) -> dict[str, RequestSnapshot]:
        """Where each request stands, with its stored response once it has one, in one round
        trip (two when some must be withdrawn). A request whose receiver stopped beating for
        the receiver timeout is declared lost here (state "cancelled", reason
        "receiver_lost"), and one still queued past its pickup deadline is withdrawn (state
        "withdrawn", reason "pickup_timeout"; its id may be enqueued again), as a waiting
        caller would do. With a started `watch`, the same round trip reads it after the
        records: `watch.lost` then says whether a record found missing may have been lost."""
        keys = self.keys.endpoint(validate_endpoint(endpoint))
        if not request_ids:
            return {}
        timeout_ms = int(self.settings.receiver_timeout_s * 1000)
        redelivery = Redelivery.of(self.settings)
        parts = [
            request_ids[start : start + MAX_READ_IDS]
            for start in range(0, len(request_ids), MAX_READ_IDS)
        ]
        calls = [read_response_call(keys, part, timeout_ms, redelivery) for part in parts]
        if watch is not None:
            calls.append(self._watch_call(keys, watch))
        replies = self._io.execute(calls)
        if watch is not None:
            watch.saw(parse_canary(replies[len(parts)]))
        found: dict[str, RequestSnapshot] = {}
        for part, reply in zip(parts, replies[: len(parts)], strict=True):
            found.update(zip(part, parse_snapshots(reply, len(part)), strict=True))
        now_ms = int(time.time() * 1000)
        overdue = [
            request_id
            for request_id, snapshot in found.items()
            if snapshot.state == "queued"
            and snapshot.pickup_left_ms is not None
            and snapshot.pickup_left_ms < 0
        ]
        if overdue:
            tombstone_ms = int(self.settings.cancel_marker_ttl_s * 1000)
            why = "pickup_timeout"
            withdraws = [
                withdraw_call(keys, rid, why, tombstone_ms, now_ms, uuid.uuid4().hex)
                for rid in overdue
            ]
            for request_id, reply in zip(overdue, self._io.execute(withdraws), strict=True):
                found[request_id] = parse_withdraw(reply)[0]
        return found

    def resolve(self, snapshot: RequestSnapshot, request_id: str, endpoint: str) -> Response | None:
        """What a final state means to a caller (prq.protocol.outcomes.resolve), with a response
        kept beside Redis read back from the store (blocking)."""
        if snapshot.state != "done":
            return resolve(snapshot, request_id, endpoint, self.signer)
        data = open_response(self.signer, request_id, endpoint, snapshot.response)
        if bodies.is_spilled(data):
            try:
                data = self.streams.load_body(data, f"the response to {request_id}")
            except PrqError as exc:
                exc.maybe_executed = True
                raise
        return response_of(data, request_id)
