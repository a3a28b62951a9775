"""A receiver's take, and deciding what of it may run.

A take (flows.take_flow) is judged before anything of it runs: a take whose reading shows the
sequence numbers went back declares data loss (prq.node.data_loss); requests numbered at or below
the fence of a declared loss (ghosts), and hand-outs this node took before
(prq.node.receiver.taken), are cancelled, not run; undecodable ones and ones whose signature fails
are dead-lettered and answered with an error; a redelivery of an at_least_once request this node ran
already gets the answer it keeps (prq.node.receiver.ran). What is left is held (`_held`) for the
handler to run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from prq.core.bodies import is_spilled
from prq.core.errors import PrqError, SerializationError, ServerError, SignatureError
from prq.core.lifecycle import DeliveryInfo, PendingRequest
from prq.core.models import Request, Response, checked_model, decode_stored_request
from prq.node.data_loss.counters import Floor
from prq.node.data_loss.scopes import Loss
from prq.node.receiver.signatures import HeldSignatures
from prq.node.receiver.taken import Verdict
from prq.observe import metrics, tracing
from prq.observe.throttle import LogThrottle
from prq.protocol.dead import dead_letter_call
from prq.protocol.dedup import delivery_hash
from prq.protocol.effects import Exec, Flow, Offload
from prq.protocol.flows.cancel import cancel_flow
from prq.protocol.flows.context import new_token
from prq.protocol.flows.receiver import TakeResult, respond_flow, take_flow
from prq.protocol.scripts.take import TakenItem

logger = logging.getLogger(__name__)

__all__ = ["Adopted", "Taker"]

#: Refused ghosts are logged at most once per endpoint in this many seconds (with the count of
#: those refused since): after a loss, every take may refuse some.
GHOST_LOG_EVERY_S = 10.0
_ghost_log = LogThrottle(GHOST_LOG_EVERY_S)


@dataclass(frozen=True, slots=True)
class Adopted:
    """Taken items sorted: to run, undecodable, delivered twice by a rolled-back Redis (to be
    cancelled), and at_least_once redeliveries of what this node ran already."""

    good: list[PendingRequest]
    bad: list[tuple[TakenItem, SerializationError]]
    refused: list[str]
    ran: list[TakenItem]


class Taker(HeldSignatures):
    """Taking requests and sorting what may run (a mixin of `QueueBase`)."""

    def _receive_flow(
        self,
        endpoint: str,
        channel: str,
        max_items: int,
        timeout_s: float,
        should_stop: Callable[[], bool] | None,
        current: list[str],
    ) -> Flow[list[PendingRequest]]:
        """Take requests (waiting for the first), and deal with what must not run: requests a
        rolled-back Redis handed out again are cancelled, undecodable ones are answered with an
        error. Returns what the handler may run. `current` gets the token of the take under
        way, so a driver whose take is cut short can give back what it got (`_unpark_flow`).
        The node's first take of an endpoint checks its layout first (flows.layout_flow)."""
        yield from self._check_layout_flow(endpoint)
        while True:
            if self._watch.presence.took(endpoint, time.monotonic()):
                self._watch.wake()
            token = self._take_token(endpoint)
            # (the floor as the take that returns was sent: one from before would be lower)
            floors = [self._watch.data_loss.floor(endpoint, time.monotonic())]
            # (and its place among this node's takes as it was sent: TakenRequests.take)
            serials = [next(self._take_serials)]

            def sending(floors: list[Floor] = floors, serials: list[int] = serials) -> int:
                floors[0] = self._watch.data_loss.floor(endpoint, time.monotonic())
                serials[0] = next(self._take_serials)
                return floors[0].stamp

            def stamped(stamp: int, floors: list[Floor] = floors) -> None:
                self._watch.data_loss.learned(endpoint, floors[0], stamp)

            self._taking[token] = endpoint
            current[:] = [token]
            try:
                with self._router.watch_take(channel, token) as signal:
                    result = yield from take_flow(
                        self.ctx, endpoint, token, signal, max_items, timeout_s, should_stop,
                        sending, stamped,
                    )  # fmt: skip
            except PrqError:
                self._take_failed(endpoint, token)
                current.clear()  # (a spare now: the next take collects what this one got)
                raise
            if token not in self._taking:
                # withdrawn while the take was on its way (the node closing: _unpark_flow):
                # what it took went back to the queue with its park, for another receiver,
                # and a take that ran after took nothing; none of it runs here
                current.clear()
                return []
            if result.redelivered:
                metrics.REDELIVERED.labels(endpoint).inc(result.redelivered)
            # What the take got is this flow's until it returns: cut short before (a cancel,
            # an error in the steps below, the node closing), none of it ran, and all of it
            # goes back with the token (`current` keeps it for the driver, `_taking` for a
            # close), let go here first
            try:
                good = yield from self._sort_taken(endpoint, floors[0], result, serials[0])
            except BaseException:
                self._let_go(endpoint, token, result.items)
                raise
            current.clear()
            if self._taking.pop(token, None) is None:  # withdrawn meanwhile: given back
                self._let_go(endpoint, token, result.items)
                return []
            if good or not (result.items or result.went_back is not None):
                return good
            # (a take that found Redis went back took nothing: the loss is declared now, and
            # the next take is judged under its fence)

    def _sort_taken(
        self, endpoint: str, floor: Floor, result: TakeResult, serial: int = 0
    ) -> Flow[list[PendingRequest]]:
        """Judge a take (its reading, ghosts), hold what may run, answer or cancel the rest;
        what the handler may run. `serial`: the take's place among this node's takes."""
        good: list[PendingRequest] = []
        self._judge_reading(endpoint, floor, result)
        items, refused = self._without_ghosts(endpoint, result.items)
        if items:
            opened, markers = yield from self._open_items(endpoint, items)
            adopted = self._adopt(endpoint, result.token, items, opened, serial)
            for pending in adopted.good:
                if pending.id in markers:
                    self._held_bodies[pending.id] = markers[pending.id]
            good, refused = adopted.good, refused + adopted.refused
            for item in adopted.ran:
                yield from self._ran_again(endpoint, result.token, item)
            for item, exc in adopted.bad:
                # kept first, so whoever sees the error answer finds the dead letter
                yield Exec((
                    dead_letter_call(
                        self.ctx, endpoint, item.request_id, item.body,
                        self._dead_reason(exc), item.attempt,
                    ),
                ))  # fmt: skip
                metrics.DEAD_LETTERED.labels(endpoint).inc()
                yield from respond_flow(
                    self.ctx, endpoint, item.request_id, result.token,
                    self._bad_item_response(item, exc),
                )  # fmt: skip
        for request_id in refused:
            yield from cancel_flow(self.ctx, request_id, endpoint, "data_loss")
        return good

    def _let_go(self, endpoint: str, token: str, items: list[TakenItem]) -> None:
        """Forget the items of a take that goes back unrun with its token (unpark.lua): not
        held, not beaten for, not remembered as taken (so that taking one again is no sign of
        a rolled-back Redis; a ghost, at or below the fence of a declared loss, stays refused
        by it)."""
        fence = self._watch.data_loss.fence_of(endpoint) or 0
        for item in items:
            pending = self._held.get(item.request_id)
            if pending is not None and pending.owner_token == token:
                self._held.pop(item.request_id, None)
                self._held_bodies.pop(item.request_id, None)
                self._watch.liveness.release(item.request_id)
                pending.mark_cancelled("given_back")
            if item.sequence > fence:
                self._taken.forget(endpoint, item.sequence, item.request_id)

    def _open_items(
        self, endpoint: str, items: list[TakenItem]
    ) -> Flow[tuple[dict[str, bytes | SerializationError], dict[str, bytes]]]:
        """Taken items' request JSON by id, or why it cannot be had: the signature checked
        (with a signing key; an expired one under the request's renewal, if a node renewed
        it), and bodies kept beside Redis read back off the event loop; and the markers of
        those (prq.core.bodies), by id."""
        opened: dict[str, bytes | SerializationError] = {}
        expired: list[tuple[TakenItem, SignatureError]] = []
        for item in items:
            try:
                opened[item.request_id] = self._open_request(endpoint, item)
            except SerializationError as exc:
                if isinstance(exc, SignatureError) and exc.reason == "expired":
                    expired.append((item, exc))
                else:
                    opened[item.request_id] = exc
        if expired:
            opened.update((yield from self._open_renewed(endpoint, expired)))
        spilled = [(i, d) for i, d in opened.items() if isinstance(d, bytes) and is_spilled(d)]
        if spilled:
            loaded = yield Offload(partial(self._streams.load_request_bodies, spilled))
            assert isinstance(loaded, dict)
            opened.update(loaded)
        return opened, dict(spilled)

    def _adopt(
        self,
        endpoint: str,
        token: str,
        items: list[TakenItem],
        opened: dict[str, bytes | SerializationError],
        serial: int = 0,
    ) -> Adopted:
        """Turn taken items into PendingRequests; set apart the undecodable ones, the ids of
        ones delivered a second time (to be cancelled, not run), and redeliveries of
        at_least_once requests this node ran already (never run twice). Items whose reply came
        late (a later take of this node got them again since: TakenRequests.take) are left
        out: their owner token lost them. `serial`: the take's place among this node's
        takes (0: unknown)."""
        good: list[PendingRequest] = []
        bad: list[tuple[TakenItem, SerializationError]] = []
        refused: list[str] = []
        ran: list[TakenItem] = []
        created: list[int] = []
        now = time.monotonic()  # (a take's items arrived together)
        decoded: list[tuple[TakenItem, Request]] = []
        for item in items:
            try:
                data = opened[item.request_id]
                if isinstance(data, SerializationError):
                    raise data
                request = decode_stored_request(data, endpoint, item.request_id)
                self._streams.bind(request.streams, delete_after_read=False)
            except SerializationError as exc:
                logger.warning(
                    "undecodable request skipped endpoint=%r request_id=%s error=%s",
                    endpoint,
                    item.request_id,
                    exc,
                )
                bad.append((item, exc))
                continue
            decoded.append((item, request))
        # Every item is looked up in the taken memory first: a repeat declares a loss, whose
        # fence then judges the whole take (its other items came from the same rolled-back
        # Redis, though this node never took them)
        verdicts = {
            item.request_id: self._first_delivery(endpoint, item, serial) for item, _ in decoded
        }
        repeats = {request_id for request_id, verdict in verdicts.items() if verdict == "again"}
        fence = self._watch.data_loss.fence_of(endpoint) if repeats else 0
        for item, request in decoded:
            if verdicts[item.request_id] == "late":
                logger.info(
                    "a take's reply came after a later take got the request again, dropped "
                    "request_id=%s attempt=%d",
                    item.request_id,
                    item.attempt,
                )
                continue
            if item.request_id in repeats or 0 < item.sequence <= fence:
                refused.append(item.request_id)
                continue
            if request.delivery == "at_least_once" and not self._first_run(endpoint, item):
                ran.append(item)
                continue
            delivery = checked_model(  # (an int, a hex digest: nothing to check)
                DeliveryInfo,
                {"attempt": item.attempt, "delivery_hash": delivery_hash(endpoint, request.id)},
            )
            pending = PendingRequest(request, delivery, token)
            tracing.picked_up(request, item.created_ms, self.node_id)
            self._held[request.id] = pending
            if self.ctx.signer is not None and request.delivery == "at_least_once":
                self._renewals.hold(request.id, endpoint, item.body, now)
            self._watch.hold(pending, now, item.sequence)
            good.append(pending)
            created.append(item.created_ms)
        metrics.taken(endpoint, created)
        return Adopted(good, bad, refused, ran)

    def _first_delivery(self, endpoint: str, item: TakenItem, serial: int = 0) -> Verdict:
        """Remember a take; what it is (prq.node.receiver.taken). "again": this node took the
        same hand-out before (the same sequence number and id, an attempt not later, not a
        reply that came late): a Redis that went back in time handed it out again, which no
        reading showed. It must not run, and data loss is declared, with what Redis holds now
        behind the fence."""
        verdict = self._taken.take(endpoint, item.sequence, item.request_id, item.attempt, serial)
        if verdict != "again":
            return verdict
        watch = self._watch.data_loss
        self._watch.declare_data_loss(
            Loss(
                f"request {item.request_id} was handed out again (sequence {item.sequence}, "
                f"attempt {item.attempt})",
                watch.scope_of(endpoint),
                watch.handed_again(endpoint, item.sequence),
            )
        )
        return "again"

    def _first_run(self, endpoint: str, item: TakenItem) -> bool:
        """Remember that this node runs an at_least_once request; False if it ran (or runs)
        the same one before: a redelivery (attempt 2 or later), not to be run again."""
        return self._ran.first_run(endpoint, item.sequence, item.request_id, item.attempt)

    def _ran_again(self, endpoint: str, token: str, item: TakenItem) -> Flow[None]:
        """A redelivery of an at_least_once request this node ran or runs: never run it again.
        Still running: the run answers under the new owner token. Answered before: the same
        answer again. Its answer no longer kept: an error saying so (not retryable)."""
        request_id = item.request_id
        running = self._held.get(request_id)
        if running is not None:
            logger.info("redelivery of a running request adopted request_id=%s", request_id)
            running.owner_token = token
            self._watch.beat_soon(request_id, time.monotonic())
            return
        body = self._ran.response(request_id)
        if body is None:
            error = ServerError(
                type="DuplicateDelivery",
                message=f"request {request_id} was handed out again to a receiver that ran it "
                "already and no longer keeps its response; it was not run again",
            )
            body = Response(id=request_id, error=error).model_dump_json().encode()
        logger.info("redelivery of a request run before answered request_id=%s", request_id)
        outcome = yield from respond_flow(self.ctx, endpoint, request_id, token, body)
        if outcome not in ("ok", "replay"):
            logger.warning("answer dropped request_id=%s outcome=%s", request_id, outcome)

    def _without_ghosts(
        self, endpoint: str, items: list[TakenItem]
    ) -> tuple[list[TakenItem], list[str]]:
        """Set apart the taken items numbered at or below the fence of a loss this node
        declared (their ids): queued before it, the Redis that lost data may hand them out
        though they ran already (ghosts), so they are cancelled, not run; their callers, if any
        still wait, get DataLoss. (0 is a number not known: such an item is not judged.)"""
        fence = self._watch.data_loss.fence_of(endpoint)
        if not fence:
            return items, []
        kept: list[TakenItem] = []
        ghosts: list[str] = []
        for item in items:
            if 0 < item.sequence <= fence:
                ghosts.append(item.request_id)
            else:
                kept.append(item)
        quiet = _ghost_log.admit(endpoint, len(ghosts)) if ghosts else None
        if quiet is not None:
            logger.warning(
                "requests queued before a data loss refused endpoint=%r count=%d%s",
                endpoint, len(ghosts),
                f" (and {quiet} in the {GHOST_LOG_EVERY_S:g} s before)" if quiet else "",
            )  # fmt: skip
        return kept, ghosts

    def _take_token(self, endpoint: str) -> str:
        """A spare token of the endpoint (`_spare_tokens`), else a new one. Serve threads take
        at once: another may pop the last spare between a look and a pop, so only the pop
        (one step) decides."""
        spare = self._spare_tokens.get(endpoint)
        if spare:
            try:
                return spare.pop()
            except IndexError:  # (another thread took the last one meanwhile)
                pass
        return new_token()

    def _take_failed(self, endpoint: str, token: str) -> None:
        self._spare_tokens.setdefault(endpoint, []).append(token)

    def _judge_reading(self, endpoint: str, floor: Floor, result: TakeResult) -> None:
        """A take's readings, sent when `floor` was had: the receiver's stamp below the one it
        sent, or the endpoint's last sequence number below the floor, says Redis went back in
        time, and data loss is declared (what the take got is then judged against the new
        fence); no number where it read one, a check is due at once."""
        if self._watch.judge_stamp(endpoint, floor, result.stamp, result.went_back):
            return
        loss = None
        if result.counter is not None:
            loss = self._watch.data_loss.read(endpoint, floor, result.counter, time.monotonic())
        if loss is not None:
            self._watch.declare_data_loss(loss)

    @staticmethod
    def _dead_reason(exc: SerializationError) -> str:
        """Why an item that must not run is dead-lettered."""
        if isinstance(exc, SignatureError):
            return f"signature {exc.reason}: {exc}"
        return f"undecodable: {exc}"

    @staticmethod
    def _bad_item_response(item: TakenItem, exc: SerializationError) -> bytes:
        error = ServerError(type=type(exc).__name__, message=str(exc)[:500])
        return Response(id=item.request_id, error=error).model_dump_json().encode()
