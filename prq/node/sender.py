"""The sender half of a node: what it does for the requests it sends.

Building and encoding a request, queueing a one-way message (`_notify_flow`), and the bookkeeping of
calls in flight: a request sent is leased in the watch's liveness (`_watch.liveness.sent`: id →
endpoint and the caller's progress callback) until its answer is read, and a call fails with
DataLoss if a data loss was declared where its endpoint lives meanwhile that its request may be one
of (prq.node.data_loss), or with QueueShutdown when closing cuts it short. Cancel and status by id
look the endpoint up there (`_sent_endpoint`). The facades drive the calls; nothing here does I/O.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from pydantic import JsonValue

from prq.core.bodies import is_spilled
from prq.core.bounds import call_duration
from prq.core.errors import (
    DataLoss,
    PrqError,
    QueueFull,
    QueueShutdown,
    QueueUnavailable,
    RemoteError,
)
from prq.core.models import Delivery, Request, Response, encode_stored_request
from prq.core.names import (
    validate_endpoint,
)
from prq.node.core import NodeCore
from prq.node.data_loss.counters import CallMark
from prq.observe import metrics
from prq.protocol.effects import Exec, Flow
from prq.protocol.flows.registry import locator_calls, registry_calls
from prq.protocol.scripts.enqueue import EnqueueOutcome, enqueue_many_call, parse_enqueue_many

__all__ = ["SenderHalf"]


class SenderHalf(NodeCore):
    """What a node does for the requests it sends (a mixin of `QueueBase`)."""

    # -- building and checking what goes to Redis -------------------------------------------

    def build_request(
        self,
        endpoint: str,
        method: str,
        params: JsonValue = None,
        *,
        service: str = "",
        priority: int = 0,
        producer: str | None = None,
        request_id: str | None = None,
        delivery: Delivery = "at_most_once",
    ) -> Request:
        fields: dict[str, object] = {
            "endpoint": endpoint,
            "method": method,
            "params": params,
            "service": service,
            "priority": priority,
            "producer": producer or self.node_id,
            "delivery": delivery,
        }
        if request_id is not None:
            fields["id"] = request_id
        return Request(**fields)

    def _encode_request(self, request: Request) -> tuple[Request, bytes]:
        validate_endpoint(request.endpoint)
        if request.producer is None:
            request = request.model_copy(update={"producer": self.node_id})
        body = encode_stored_request(request)
        self._check_size(body, "request", request.id)
        return request, body

    @staticmethod
    def _data_spent(request: Request, body: bytes, error: BaseException | None) -> bool:
        """Whether a finished call's data beside Redis (DataStreams, a large body) can be
        deleted by its caller: only when the request never ran and never will (withdrawn,
        refused). A receiver deletes it once its answer was accepted; a dead-lettered request
        keeps it for a replay until its expiry, and the sweep removes whatever is left then."""
        return (
            (is_spilled(body) or bool(request.streams))
            and isinstance(error, PrqError)
            and not error.maybe_executed
            and not isinstance(error, (QueueUnavailable, QueueShutdown))
        )

    def _pickup_timeout(self, pickup_timeout_s: float | None) -> float:
        if pickup_timeout_s is None:
            return self.settings.pickup_timeout_s
        return call_duration("pickup_timeout_s", pickup_timeout_s)

    def _notify_flow(
        self, request: Request, body: bytes, pickup_timeout_s: float | None
    ) -> Flow[str]:
        """Queue a one-way message (a detached request whose answer is not kept), in one round
        trip with the endpoint's registry entry on this node's first use of it (and a locator
        with `request_locators`); its id. A known id is not queued again."""
        settings = self.settings
        pickup_s = self._pickup_timeout(pickup_timeout_s)
        now_ms = int(time.time() * 1000)
        attempts = settings.max_attempts if request.delivery == "at_least_once" else 0
        if self.ctx.signer is not None:
            valid_s = settings.signature_ttl_s(pickup_s, max(1, attempts))
            body = self.ctx.signer.sign("request", request.id, request.endpoint, body,
                                        now_ms + int(valid_s * 1000))  # fmt: skip
        call = enqueue_many_call(
            self.keys.endpoint(request.endpoint), uuid.uuid4().hex, [(request.id, body)], now_ms,
            int(pickup_s * 1000), int(settings.request_ttl_s(pickup_s) * 1000),
            int(settings.list_ttl_s * 1000), request.priority, request.producer or self.node_id,
            attempts, one_way=True,
        )  # fmt: skip
        beside = locator_calls(self.keys, settings, request.id, request.endpoint, pickup_s)
        yield from self._check_layout_flow(request.endpoint)
        if self._first_use(request.endpoint):
            beside += registry_calls(self.keys, settings, [request.endpoint], now_ms)
        try:
            replies = yield Exec((call, *beside))
        except QueueUnavailable as exc:  # (sent: it may be queued, and run)
            raise QueueUnavailable(
                f"{exc} Message {request.id} may have been queued and may still run; sending "
                "it again with the same id is safe (it is never queued twice).",
                maybe_executed=True,
            ) from exc
        assert isinstance(replies, list)
        self._watch.presence.sent(request.endpoint, time.monotonic())
        outcome = parse_enqueue_many(replies[0], 1)
        if outcome.refused_ids:
            raise QueueFull(
                f"endpoint {request.endpoint!r} is at its max_pending: message {request.id} "
                "was not queued; try again later"
            )
        if outcome.accepted:
            metrics.series(request.endpoint).enqueued.inc()
        return request.id

    def _first_use(self, endpoint: str) -> bool:
        """Whether this node has not used `endpoint` lately: its first enqueue then registers
        the endpoint in the same round trip (later ones leave it to the presence reports), so
        the admin view lists it, and status and cancel by id find its requests, even if this
        process exits right after sending."""
        return endpoint not in self._watch.presence.used

    @staticmethod
    def _result(request: Request, response: Response) -> JsonValue:
        if response.error is not None:
            raise RemoteError(response.error, request_id=request.id, endpoint=request.endpoint)
        return response.result

    # -- calls in flight ------------------------------------------------------------------------

    @staticmethod
    def _cancelled(endpoint: str) -> None:
        """A cancel() of this node cancelled a request of `endpoint`."""
        metrics.CANCELLED.labels(endpoint).inc()

    def _enqueued(
        self,
        mark: CallMark,
        outcome: EnqueueOutcome,
        then: Callable[[], None] | None = None,
    ) -> None:
        """The enqueue step of the call of `mark` answered with `outcome` (a new request's
        sequence number, or the id known already: nothing enqueued); then `then` is called."""
        if outcome.counter is not None:
            metrics.ENQUEUED.labels(mark.endpoint).inc()
        self._watch.enqueued(
            mark, outcome.counter, outcome.before, outcome.stamp, outcome.went_back,
            outcome.refused,
        )  # fmt: skip
        if then is not None:
            then()

    @staticmethod
    def _redelivered(endpoint: str, state: str) -> None:
        """A call of this node handed its at_least_once request out again ("queued"), or
        dead-lettered it with its attempts used up ("cancelled")."""
        metrics.REDELIVERED.labels(endpoint).inc()
        if state == "cancelled":
            metrics.DEAD_LETTERED.labels(endpoint).inc()

    def _sending(
        self, request: Request, on_progress: Callable[[int, int], None] | None = None
    ) -> None:
        self._watch.send(request.id, request.endpoint, time.monotonic(), on_progress)

    def _sent_endpoint(self, request_id: str) -> str | None:
        lease = self._watch.liveness.sent.get(request_id)
        return lease.endpoint if lease is not None else None

    def _check_epoch(self, mark: CallMark | None) -> None:
        """Raise DataLoss if the node declared data loss where the call's endpoint lives since
        the call began, and its request may be one the loss took (`mark`: NodeWatch.mark)."""
        if mark is not None and not self._watch.survives(mark):
            raise DataLoss(
                "Redis lost or rolled back its data while this call was in flight; the request "
                "may or may not have run. Retry if it is safe (the same request id is fine)."
            )

    @staticmethod
    def _shutdown_error(sent: bool = False) -> QueueShutdown:
        """QueueShutdown for a step cut short by closing; `sent`: it had sent something to
        Redis already (a call's request may be enqueued and may run, so maybe_executed)."""
        if not sent:
            return QueueShutdown(
                "the queue was closed before the call reached Redis; nothing was sent. Retry "
                "elsewhere."
            )
        return QueueShutdown(
            "the queue was closed while the call was waiting; its request may have been "
            "enqueued and may still run. Retrying elsewhere with the same request id is safe "
            "(it is never enqueued twice).",
            maybe_executed=True,
        )
