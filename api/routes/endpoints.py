"""What Redis holds per endpoint: depth, in flight, oldest age, receivers, queued requests,
and the enqueue rate over the last minutes (any valid token); and forgetting an endpoint (an
admin token: see prq.protocol.forget)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, status

from api.auth import require_admin, require_read
from api.deps import EndpointQuery, ForgetQuery, QueuedQuery, ServiceDep
from api.errors import error_responses
from api.throughput import Throughput
from prq.ops.answers import EndpointInfo, QueuedPage
from prq.protocol.forget import ForgetOutcome

__all__ = ["router"]

router = APIRouter(prefix="/api", tags=["endpoints"], dependencies=[Depends(require_read)])


@router.get(
    "/endpoints",
    response_model=list[EndpointInfo],
    summary="Every endpoint Redis knows",
    responses=error_responses(401, 503),
)
async def list_endpoints(service: ServiceDep) -> list[EndpointInfo]:
    """Depth, in flight, oldest queued age and live receivers of every endpoint, by name."""
    return await service.redis(service.inspector.endpoints())


@router.get(
    "/endpoint",
    response_model=EndpointInfo,
    summary="One endpoint",
    responses=error_responses(401, 422, 503),
)
async def get_endpoint(service: ServiceDep, query: EndpointQuery) -> EndpointInfo:
    """One endpoint's figures (all zero for an endpoint Redis holds nothing for)."""
    return await service.redis(service.inspector.endpoint(query.endpoint))


@router.get(
    "/queued",
    response_model=QueuedPage,
    summary="An endpoint's queued requests, in pickup order",
    responses=error_responses(401, 422, 503),
)
async def list_queued(service: ServiceDep, query: QueuedQuery) -> QueuedPage:
    """A page of the requests waiting for pickup (bodies are not shown, only their size)."""
    page = service.inspector.queued(query.endpoint, offset=query.offset, limit=query.limit)
    return await service.redis(page)


@router.get(
    "/throughput",
    response_model=Throughput,
    summary="Enqueue rate per endpoint over the last minutes",
    responses=error_responses(401),
)
async def throughput(service: ServiceDep) -> Throughput:
    """Requests enqueued per second, one point per sample interval, oldest first."""
    return service.sampler.snapshot()


@router.delete(
    "/endpoint",
    response_model=ForgetOutcome,
    summary="Forget an endpoint (remove it from the registry)",
    dependencies=[Depends(require_admin)],
    responses=error_responses(401, 403, 404, 409, 422, 503),
)
async def forget_endpoint(service: ServiceDep, query: ForgetQuery) -> ForgetOutcome:
    """Remove the endpoint from the list of endpoints; never removes a request. 409 while it
    holds work or has a live receiver, unless `force=true` (its requests then stay queued until
    taken or expired); 404 when it is not listed. A receiver still serving it, or a node that
    used it lately, lists it again within a few seconds."""
    outcome = await service.redis(service.queue.forget_endpoint(query.endpoint, force=query.force))
    if not outcome.registered:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "the endpoint is not listed")
    if not outcome.forgotten and outcome.busy:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"the endpoint has {outcome.depth} queued, {outcome.in_flight} in flight and "
            f"{outcome.receivers} live receivers; forget it anyway with force=true (nothing "
            "queued is removed)",
        )
    return outcome
