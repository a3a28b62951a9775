"""A receiver's take, and deciding what of it may run.

A take (flows.take_flow) is judged before anything of it runs: a take that shows the enqueue counter
went back declares data loss and cancels all it got (prq.node.data_loss); requests queued before a
declared loss (ghosts), and hand-outs this node took before (prq.node.receiver.taken), are
cancelled, not run; undecodable ones and ones whose signature fails are dead-lettered and answered
with an error; a redelivery of an at_least_once request this node ran already gets the answer it
keeps (prq.node.receiver.ran). What is left is held (`_held`) for the handler to run.
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
from prq.core.models import Response, checked_model, decode_stored_request
from prq.node.data_loss.counters import Floor
from prq.node.receiver.signatures import HeldSignatures
from prq.observe import metrics, tracing
from prq.protocol.dead import dead_letter_call
from prq.protocol.dedup import delivery_hash
from prq.protocol.effects import Exec, Flow, Offload
from prq.protocol.flows.cancel import cancel_flow
from prq.protocol.flows.context import new_token
from prq.protocol.flows.receiver import TakeResult, respond_flow, take_flow
from prq.protocol.scripts.take import TakenItem

logger = logging.getLogger(__name__)

__all__ = ["Adopted", "Taker"]


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
            floor = self._watch.data_loss.floor(endpoint, time.monotonic())
            sent_epoch = self._watch.data_loss.epoch
            self._taking[token] = endpoint
            current[:] = [token]
            try:
                with self._router.watch_take(channel, token) as signal:
                    result = yield from take_flow(
                        self.ctx, endpoint, token, signal, max_items, timeout_s, should_stop
                    )
            except PrqError:
                self._take_failed(endpoint, token)
                raise
            self._taking.pop(token, None)
            current.clear()
            if result.redelivered:
                metrics.REDELIVERED.labels(endpoint).inc(result.redelivered)
            good: list[PendingRequest] = []
            if self._rolled_back(endpoint, floor, sent_epoch, result):
                refused = [item.request_id for item in result.items]
            else:
                items, ghosts = self._without_ghosts(endpoint, result.items, result.counter)
                opened, markers = yield from self._open_items(endpoint, items)
                adopted = self._adopt(endpoint, result.token, items, opened)
                for pending in adopted.good:
                    if pending.id in markers:
                        self._held_bodies[pending.id] = markers[pending.id]
                good, refused = adopted.good, adopted.refused + ghosts
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
            if good or not result.items:
                return good

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
    ) -> Adopted:
        """Turn taken items into PendingRequests; set apart the undecodable ones, the ids of
        ones delivered a second time (to be cancelled, not run), and redeliveries of
        at_least_once requests this node ran already (never run twice)."""
        good: list[PendingRequest] = []
        bad: list[tuple[TakenItem, SerializationError]] = []
        refused: list[str] = []
        ran: list[TakenItem] = []
        created: list[int] = []
        now = time.monotonic()  # (a take's items arrived together)
        life = self._watch.data_loss.life(endpoint, now)
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
            if not self._first_delivery(endpoint, item, life):
                refused.append(item.request_id)
                continue
            if request.delivery == "at_least_once" and not self._first_run(endpoint, item, life):
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
            self._watch.hold(pending, now)
            good.append(pending)
            created.append(item.created_ms)
        metrics.taken(endpoint, created)
        return Adopted(good, bad, refused, ran)

    def _first_delivery(self, endpoint: str, item: TakenItem, life: int) -> bool:
        """Remember a take; False if this node took the same hand-out before (the same
        sequence number in this life of the endpoint's counter, the same id, an attempt not
        later): a Redis that went back in time handed it out again, and it must not run. Data
        loss is declared, unless it was already when that Redis was met
        (prq.node.receiver.taken)."""
        epoch = self._watch.data_loss.epoch_of(endpoint)
        verdict = self._taken.take(
            endpoint, item.sequence, item.request_id, item.attempt, life, epoch
        )
        if verdict == "again":
            self._watch.declare_data_loss(
                f"request {item.request_id} was handed out again (sequence {item.sequence}, "
                f"attempt {item.attempt})",
                self._watch.data_loss.scope_of(endpoint),
            )
        elif verdict == "again_after_loss":
            logger.warning(
                "request handed out again after data loss refused request_id=%s sequence=%d",
                item.request_id, item.sequence,
            )  # fmt: skip
        return verdict == "first"

    def _first_run(self, endpoint: str, item: TakenItem, life: int) -> bool:
        """Remember that this node runs an at_least_once request; False if it ran (or runs)
        the same one before: a redelivery (attempt 2 or later), not to be run again."""
        generation = (self._watch.data_loss.epoch_of(endpoint), life)
        return self._ran.first_run(
            endpoint, item.sequence, item.request_id, item.attempt, generation
        )

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
        self, endpoint: str, items: list[TakenItem], counter: int | None
    ) -> tuple[list[TakenItem], list[str]]:
        """Set apart the taken items queued before a loss this node declared (their ids): the
        Redis that lost data may hand them out though they ran already (data_loss: ghosts), so
        they are cancelled, not run; their callers, if any still wait, get DataLoss. `counter`:
        the take's reading of the enqueue counter."""
        up_to = self._watch.data_loss.ghosts_for_take(endpoint, counter)
        if not up_to:
            return items, []
        kept: list[TakenItem] = []
        ghosts: list[str] = []
        for item in items:
            if 0 < item.sequence <= up_to:
                ghosts.append(item.request_id)
            else:
                kept.append(item)
        if ghosts:
            logger.warning(
                "requests queued before a data loss refused endpoint=%r count=%d",
                endpoint, len(ghosts),
            )  # fmt: skip
        return kept, ghosts

    def _take_token(self, endpoint: str) -> str:
        spare = self._spare_tokens.get(endpoint)
        return spare.pop() if spare else new_token()

    def _take_failed(self, endpoint: str, token: str) -> None:
        self._spare_tokens.setdefault(endpoint, []).append(token)

    def _rolled_back(
        self, endpoint: str, floor: Floor | None, sent_epoch: int, result: TakeResult
    ) -> bool:
        """A take saw the enqueue counter lower than known (and vouched for) before it was
        sent (in epoch `sent_epoch`): Redis went back in time, and what it handed out may have
        run already. Declare data loss (True)."""
        if result.counter is None:
            return False
        now = time.monotonic()
        watch = self._watch.data_loss
        reason = watch.read(endpoint, floor, result.counter, now, sent_epoch)
        if reason:
            self._watch.declare_data_loss(reason, watch.scope_of(endpoint))
            # (the first reading after it: it was taken after the loss, which it showed)
            watch.read(endpoint, None, result.counter, now, watch.epoch)
            return True
        return False

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
