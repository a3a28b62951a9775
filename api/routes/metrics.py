"""Prometheus `/metrics` (any valid token): prq's counters and histograms of this process, and
per-endpoint gauges read from Redis on each scrape (one read for all endpoints), and Redis's
memory and evictions (INFO, per server)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.auth import require_read
from api.deps import ServiceDep
from api.errors import error_responses
from prq.ops.exporter import refresh_endpoint_gauges, refresh_redis_gauges

__all__ = ["router"]

router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    # A bare Response: the 200 is text, while the declared errors stay JSON.
    response_class=Response,
    summary="Prometheus metrics",
    dependencies=[Depends(require_read)],
    responses={
        200: {
            "description": "Prometheus text exposition format",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        **error_responses(401, 503),
    },
)
async def metrics(service: ServiceDep) -> Response:
    """Every `prq_` metric; the endpoint and Redis gauges are refreshed from Redis first."""
    await service.redis(refresh_endpoint_gauges(service.inspector))
    await service.redis(refresh_redis_gauges(service.inspector))
    return Response(content=generate_latest(), media_type=CONTENT_TYPE_LATEST)
