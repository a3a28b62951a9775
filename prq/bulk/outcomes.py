"""Reading the outcomes of detached requests (OutcomeReading): where each stands, with its
response once it has one, the overdue withdrawn and the silent receivers' requests declared
lost as a waiting caller would, with a loss watch (prq.bulk.watch.LossWatch) that tells a
record lost from one expired."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

from prq.bulk.base import BulkBase
from prq.bulk.dedup import Ledger
from prq.bulk.watch import LOSS_WATCH_TTL_S, LossWatch, WatchStart, job_mark_calls, parse_generation
from prq.core import bodies
from prq.core.errors import PrqError, SerializationError
from prq.core.keys import EndpointKeys
from prq.core.models import Response
from prq.core.names import validate_endpoint
from prq.protocol.effects import Call, Exec, Flow
from prq.protocol.outcomes import open_response, resolve, response_of
from prq.protocol.scripts.liveness import parse_canary
from prq.protocol.scripts.redelivery import Redelivery
from prq.protocol.scripts.replies import RequestSnapshot, as_array
from prq.protocol.scripts.request_state import (
    MAX_READ_IDS,
    parse_snapshots,
    parse_withdraw,
    read_response_call,
    withdraw_call,
)

# (LossWatch and LOSS_WATCH_TTL_S live in prq.bulk.watch; imported from here too, as before)
__all__ = ["LOSS_WATCH_TTL_S", "TAKEN_BEFORE", "LossWatch", "OutcomeReading"]

#: The reason of a "missing" snapshot whose id the reader's ledger holds: a receiver took the
#: request (it ran, or may have), and its record and answer have expired since.
TAKEN_BEFORE = "taken_before"


class OutcomeReading(BulkBase):
    """How a BulkClient reads outcomes, and a loss watch with them."""

    def start_watch(self, endpoint: str, watch: LossWatch, *, job: str | None = None) -> WatchStart:
        """Start `watch` on `endpoint` (one round trip), before sending what it watches.

        `job`: the name of a job several writers share (each with its own watch: the tasks of
        a Spark action); the same round trip joins the job's mark, and the generation it read
        tells, after the job, which writers wrote before a loss that came while none of them
        wrote (prq.bulk.watch.may_have_lost)."""
        return self._run(self.start_watch_flow(endpoint, watch, job=job))

    def start_watch_flow(
        self, endpoint: str, watch: LossWatch, *, job: str | None = None
    ) -> Flow[WatchStart]:
        """`start_watch`, as a flow."""
        keys = watch.keys(self.keys, validate_endpoint(endpoint))
        calls = [watch.step_call(keys)]
        if job is not None:
            calls += job_mark_calls(keys, job)
        replies = yield Exec(tuple(calls))
        assert isinstance(replies, list)
        value, clock = parse_canary(replies[0])
        watch.saw(value)
        if job is not None:
            watch.job = job
        return WatchStart(clock, parse_generation(replies[-1]) if job is not None else 0)

    def outcomes(
        self,
        endpoint: str,
        request_ids: Sequence[str],
        *,
        watch: LossWatch | None = None,
        ledger: Ledger | None = None,
    ) -> dict[str, RequestSnapshot]:
        """Where each request stands, with its stored response once it has one, in one round
        trip (two when some must be withdrawn). A request whose receiver stopped beating for
        the receiver timeout is declared lost here (state "cancelled", reason
        "receiver_lost"), and one still queued past its pickup deadline is withdrawn (state
        "withdrawn", reason "pickup_timeout"; its id may be enqueued again), as a waiting
        caller would do. With a started `watch`, the same round trip reads it after the
        records: `watch.lost` then says whether a record found missing may have been lost.

        Nothing stored under an id is state "missing". With the `ledger` the requests were
        enqueued with, one more round trip (only when some are missing) asks it which of
        those a receiver took: their reason is TAKEN_BEFORE (they ran, or may have, and their
        answers expired; an enqueue with the ledger does not queue them again), the others'
        is empty (no receiver took them, or nothing says so)."""
        return self._run(self.outcomes_flow(endpoint, request_ids, watch=watch, ledger=ledger))

    def outcomes_flow(
        self,
        endpoint: str,
        request_ids: Sequence[str],
        *,
        watch: LossWatch | None = None,
        ledger: Ledger | None = None,
    ) -> Flow[dict[str, RequestSnapshot]]:
        """`outcomes`, as a flow."""
        keys = self.keys.endpoint(validate_endpoint(endpoint))
        if not request_ids:
            return {}
        timeout_ms = int(self.settings.receiver_timeout_s * 1000)
        redelivery = Redelivery.of(self.settings, self.redis_settings)
        parts = [
            request_ids[start : start + MAX_READ_IDS]
            for start in range(0, len(request_ids), MAX_READ_IDS)
        ]
        calls = [read_response_call(keys, part, timeout_ms, redelivery) for part in parts]
        if watch is not None:
            calls.append(watch.step_call(watch.keys(self.keys, endpoint)))
        replies = yield Exec(tuple(calls))
        assert isinstance(replies, list)
        if watch is not None:
            watch.saw(parse_canary(replies[len(parts)])[0])
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
            withdrawn = yield Exec(tuple(withdraws))
            assert isinstance(withdrawn, list)
            for request_id, reply in zip(overdue, withdrawn, strict=True):
                found[request_id] = parse_withdraw(reply)[0]
        if ledger is not None:
            yield from self._mark_taken(keys, ledger, found)
        return found

    def _mark_taken(
        self, keys: EndpointKeys, ledger: Ledger, found: dict[str, RequestSnapshot]
    ) -> Flow[None]:
        """Give the missing ids of `found` that `ledger` holds the reason TAKEN_BEFORE. (Once
        a record is gone nothing adds its id to the ledger, so asking after the read that
        found it missing cannot miss a take.)"""
        missing = [rid for rid, snapshot in found.items() if snapshot.state == "missing"]
        if not missing:
            return
        token, _ = ledger.spelled()
        replies = yield Exec((Call(("SMISMEMBER", keys.ledger(token), *missing)),))
        assert isinstance(replies, list)
        reply = replies[0]
        flags = as_array(reply, "SMISMEMBER")
        if len(flags) != len(missing):
            raise SerializationError(f"unexpected SMISMEMBER reply from Redis: {reply!r:.200}")
        for request_id, taken in zip(missing, flags, strict=True):
            if taken == 1:
                found[request_id] = RequestSnapshot("missing", b"", TAKEN_BEFORE)

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
