"""Outcomes: what a request's final state means to its caller.

`done` is the stored response; `withdrawn` is an error that says the request never ran
(PickupTimeout, CancelledBeforePickup, CallTimeout before pickup); `cancelled` is an error that
says it may have run, by why it was cancelled (ReceiverLost, DataLoss, CallTimeout, or
CancelledAfterPickup); `missing` is DataLoss, or RequestExpired for a caller that had not looked
for longer than an answer it waits for is surely kept (`missing_error`). Pure.
"""

from __future__ import annotations

from prq.core.bodies import is_spilled
from prq.core.errors import (
    CallTimeout,
    CancelledAfterPickup,
    CancelledBeforePickup,
    DataLoss,
    PickupTimeout,
    PrqError,
    ReceiverLost,
    RequestExpired,
    SerializationError,
)
from prq.core.lifecycle import RequestState
from prq.core.models import Response, decode_response
from prq.protocol.scripts.replies import HANDED, RequestSnapshot
from prq.protocol.signing import Signer, unwrap

__all__ = ["missing_error", "open_response", "resolve", "response_of"]


def open_response(signer: Signer | None, request_id: str, endpoint: str, data: bytes) -> bytes:
    """A stored response's JSON: its signature checked with a signer (SignatureError when it
    fails), its envelope dropped without one."""
    if signer is None:
        return unwrap(data)
    return signer.open("response", request_id, endpoint, data)


def response_of(data: bytes, request_id: str) -> Response:
    """An opened response's JSON as the Response to `request_id` (SerializationError if it is
    not one, or names another request)."""
    if is_spilled(data):
        raise SerializationError(
            f"the response to {request_id} is kept beside Redis (over inline_limit_bytes); "
            "read it through a queue that has the DataStreamStore"
        )
    response = decode_response(data)
    if response.id != request_id:
        raise SerializationError(
            f"stored response for {request_id} names another request ({response.id})"
        )
    return response


def resolve(
    snapshot: RequestSnapshot, request_id: str, endpoint: str, signer: Signer | None = None
) -> Response | None:
    """Turn a final state into its outcome: a Response, or the matching error; None if open.
    With a signer, a response whose signature does not verify raises SignatureError."""
    state = snapshot.state
    if state == RequestState.DONE:
        return response_of(open_response(signer, request_id, endpoint, snapshot.response),
                           request_id)  # fmt: skip
    if state in (RequestState.QUEUED, RequestState.TAKEN, HANDED):
        return None
    where = {"request_id": request_id, "endpoint": endpoint}
    if state == RequestState.WITHDRAWN:
        if snapshot.reason == "pickup_timeout":
            raise PickupTimeout(
                f"no receiver picked up request {request_id} for endpoint {endpoint!r} in "
                "time; it was withdrawn and will never run. Check that a receiver serves the "
                "endpoint, then retry.",
                **where,
            )
        if snapshot.reason == "redelivery_timeout":
            raise ReceiverLost(
                f"the receiver of at_least_once request {request_id} for {endpoint!r} went "
                "silent and the request was handed out again, but no receiver picked it up in "
                "time; it was withdrawn. It may have run once. Retry if it is safe.",
                **where,
            )
        if snapshot.reason == "call_timeout":
            raise CallTimeout(
                f"request {request_id} timed out before pickup; it was withdrawn and will "
                "never run",
                maybe_executed=False,
                **where,
            )
        raise CancelledBeforePickup(
            f"request {request_id} was cancelled before pickup; it will never run", **where
        )
    if state == RequestState.CANCELLED:
        raise _cancelled_error(snapshot.reason, request_id, endpoint)
    if state == "missing":
        raise missing_error(request_id, endpoint)
    raise SerializationError(f"request {request_id} has an unknown state {state!r} in Redis")


def missing_error(
    request_id: str, endpoint: str, unseen_s: float | None = None, waited_s: float = 0.0
) -> PrqError:
    """The error for a request whose record is gone. A caller that saw it unanswered
    `unseen_s` ago knows its answer, if any, is kept at least `waited_s` (an answer a caller
    waits for: QueueSettings.waited_response_ttl_s): sooner than that, Redis lost it
    (DataLoss); later, the answer may simply have expired before it was read (RequestExpired).
    `unseen_s` None: nothing is known of when it was last seen (DataLoss)."""
    if unseen_s is not None and unseen_s >= waited_s:
        return RequestExpired(
            f"Redis no longer holds request {request_id} for endpoint {endpoint!r}, and this "
            f"caller last saw it unanswered {unseen_s:.1f} s ago, longer than an answer it "
            f"waits for is surely kept ({waited_s:g} s: twice poll_interval_s, plus "
            "retry_budget_s and a second): most likely its answer expired before it was read "
            "(the caller was paused or cut off), or Redis lost it. The request may have run; "
            "retry if it is safe to.",
            request_id=request_id,
            endpoint=endpoint,
        )
    return DataLoss(
        f"Redis no longer holds request {request_id} for endpoint {endpoint!r}: it lost "
        "data (restart, flush or failover). The request may or may not have run; retry "
        "if it is safe to.",
        request_id=request_id,
    )


def _cancelled_error(reason: str, request_id: str, endpoint: str) -> PrqError:
    """The error for a request cancelled after pickup, by why it was cancelled."""
    where = {"request_id": request_id, "endpoint": endpoint}
    if reason == "receiver_lost":
        return ReceiverLost(
            f"the node holding request {request_id} for {endpoint!r} stopped sending heartbeats "
            "and is presumed lost; the service may or may not have run it. Retry if it is safe.",
            **where,
        )
    if reason == "receiver_shutdown":
        return ReceiverLost(
            f"the node holding request {request_id} for {endpoint!r} shut down before it "
            "answered; the service may or may not have run it. Retry if it is safe.",
            **where,
        )
    if reason == "attempts_exhausted":
        return ReceiverLost(
            f"at_least_once request {request_id} for {endpoint!r} used up its attempts (the "
            "queue's max_attempts), each receiver going silent; it may have run, and it was "
            "moved to the endpoint's dead letters, from where it can be replayed.",
            **where,
        )
    if reason == "data_loss":
        return DataLoss(
            f"Redis lost data while request {request_id} was in flight; it may have run. "
            "Retry if it is safe.",
            request_id=request_id,
        )
    if reason == "call_timeout":
        return CallTimeout(
            f"request {request_id} to {endpoint!r} timed out after pickup and was cancelled; "
            "the service may have run it",
            maybe_executed=True,
            **where,
        )
    return CancelledAfterPickup(
        f"request {request_id} was cancelled after pickup ({reason or 'cancelled'}); "
        "the service may have run it",
        **where,
    )
