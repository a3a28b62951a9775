"""What Redis holds per endpoint: depth, in flight, oldest age, receivers, queued requests,
and the enqueue rate over the last minutes. Read-only: any valid token."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from api.auth import require_read
from api.deps import EndpointQuery, QueuedQuery, ServiceDep
from api.errors import error_responses
from api.throughput import Throughput
from prq.admin import EndpointInfo, QueuedPage

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
