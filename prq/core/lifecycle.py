"""A request's life: its states, the status snapshot that reports them, and a taken request
(PendingRequest: its delivery and its cancellation signal).

A request moves through these states (`RequestState`):

    queued ──take──▶ taken ──apply_response──▶ done
       │                 │
       └─withdraw─▶ withdrawn   (pickup timeout, or cancel before pickup)
                         └─cancel─▶ cancelled

`done`, `withdrawn` and `cancelled` are final; a response that arrives after a final state is
dropped. `unknown` means Redis holds nothing for the id (never enqueued, expired, or lost).
"""

from __future__ import annotations

import enum
import threading

from pydantic import BaseModel, ConfigDict

from prq.core.models import Request

__all__ = ["DeliveryInfo", "PendingRequest", "RequestState", "RequestStatus"]


class RequestState(enum.StrEnum):
    """Where a request is in its life (see the module docstring)."""

    QUEUED = "queued"
    TAKEN = "taken"
    DONE = "done"
    WITHDRAWN = "withdrawn"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"


class RequestStatus(BaseModel):
    """A snapshot of one request, as `status(request_id)` reports it."""

    model_config = ConfigDict(frozen=True)

    id: str
    state: RequestState
    endpoint: str | None = None
    reason: str | None = None
    attempt: int = 0
    created_ms: int | None = None
    taken_ms: int | None = None
    done_ms: int | None = None


class DeliveryInfo(BaseModel):
    """Which attempt this is, and a hash that stays the same on every attempt."""

    model_config = ConfigDict(frozen=True)

    attempt: int = 1
    delivery_hash: str


#: Guards the making of a PendingRequest's cancellation event against its setting (rare,
#: brief: one lock for all of them costs less than one per request).
_CANCEL_LOCK = threading.Lock()


class PendingRequest:
    """A request a receiver has taken: the request, its delivery and its cancellation signal.

    `owner_token` proves to Redis that this receiver holds the request; `apply_response`
    presents it, so a receiver that lost the request can no longer answer it.
    """

    __slots__ = ("_cancel_reason", "_cancelled", "delivery", "owner_token", "request")

    def __init__(self, request: Request, delivery: DeliveryInfo, owner_token: str) -> None:
        self.request = request
        self.delivery = delivery
        self.owner_token = owner_token
        # made by the first wait_cancelled (most requests are never waited on that way)
        self._cancelled: threading.Event | None = None
        self._cancel_reason: str | None = None

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def cancelled(self) -> bool:
        """True once the request was cancelled (by its caller, or because a node was lost)."""
        return self._cancel_reason is not None

    @property
    def cancel_reason(self) -> str | None:
        """Why it was cancelled: `cancelled`, `sender_lost`, `data_loss`, ...; None if not."""
        return self._cancel_reason

    def mark_cancelled(self, reason: str) -> None:
        """Signal cancellation; the first reason sticks."""
        with _CANCEL_LOCK:
            if self._cancel_reason is not None:
                return
            self._cancel_reason = reason
            event = self._cancelled
        if event is not None:
            event.set()

    def wait_cancelled(self, timeout_s: float | None = None) -> bool:
        """Block until cancelled or `timeout_s` passes; True if cancelled."""
        with _CANCEL_LOCK:
            event = self._cancelled
            if event is None:
                event = self._cancelled = threading.Event()
                if self._cancel_reason is not None:
                    event.set()
        return event.wait(timeout_s)

    def __repr__(self) -> str:
        return (
            f"PendingRequest(id={self.id!r}, endpoint={self.request.endpoint!r}, "
            f"method={self.request.method!r}, attempt={self.delivery.attempt})"
        )
