"""One request by id: its status (any valid token) and cancel (admin token).

Both go through the service's own queue node, so they work for a request sent from any node.
An id Redis knows nothing about (never sent, expired, lost) is 404.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, status
from pydantic import BaseModel

from api.auth import require_admin, require_read
from api.deps import RequestIdPath, ServiceDep
from api.errors import error_responses
from prq.core.lifecycle import RequestState, RequestStatus

__all__ = ["CancelResult", "router"]

router = APIRouter(prefix="/api/requests", tags=["requests"])


class CancelResult(BaseModel):
    """What a cancel did: `cancelled` is true if this call cancelled the request."""

    id: str
    cancelled: bool
    state: RequestState


def _not_found(request_id: str) -> HTTPException:
    return HTTPException(
        status_code=status.HTTP_404_NOT_FOUND,
        detail=f"no request {request_id} is known (never sent, expired, or lost)",
    )


@router.get(
    "/{request_id}",
    response_model=RequestStatus,
    summary="Where a request stands",
    dependencies=[Depends(require_read)],
    responses=error_responses(401, 404, 422, 503),
)
async def get_status(service: ServiceDep, request_id: RequestIdPath) -> RequestStatus:
    """queued, taken, done, withdrawn or cancelled, with its times; 404 when unknown."""
    found = await service.redis(service.queue.status(request_id))
    if found.state is RequestState.UNKNOWN:
        raise _not_found(request_id)
    return found


@router.post(
    "/{request_id}/cancel",
    response_model=CancelResult,
    summary="Cancel a request",
    dependencies=[Depends(require_admin)],
    responses=error_responses(401, 403, 404, 413, 422, 503),
)
async def cancel(service: ServiceDep, request_id: RequestIdPath) -> CancelResult:
    """Withdraw it before pickup, or signal its receiver after; the caller gets Cancelled*.

    `cancelled` is false when the request had already finished (its `state` says how).
    """
    cancelled = await service.redis(service.queue.cancel(request_id))
    after = await service.redis(service.queue.status(request_id))
    if after.state is RequestState.UNKNOWN and not cancelled:
        raise _not_found(request_id)
    return CancelResult(id=request_id, cancelled=cancelled, state=after.state)
