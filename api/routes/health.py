"""`/health` (no auth: it reveals no queue data) and `/api/whoami`.

Health is `ok`, `degraded` (Redis answers but evicts keys or persists in a way that defeats
data-loss detection: see `redis.warnings`) or `down` (Redis does not answer within
`redis_timeout_s`; status 503). Why Redis is down goes to the log, not to the unauthenticated
client.
"""

from __future__ import annotations

import logging
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Response, status
from pydantic import BaseModel

from api.auth import Role, require_read
from api.deps import ServiceDep
from api.errors import error_responses
from prq.core.errors import PrqError
from prq.ops.answers import RedisHealth

__all__ = ["Health", "WhoAmI", "router"]

logger = logging.getLogger(__name__)

router = APIRouter()


class Health(BaseModel):
    """The service's and Redis's state, for load balancers and people."""

    status: Literal["ok", "degraded", "down"]
    version: str
    redis: RedisHealth
    data_loss_events: int
    node_id: str


class WhoAmI(BaseModel):
    """The role of the token presented."""

    role: Role


def _down(message: str) -> RedisHealth:
    return RedisHealth(
        ok=False,
        version=None,
        maxmemory_policy=None,
        persistence=[],
        warnings=[],
        error=message,
    )


@router.get(
    "/health",
    response_model=Health,
    summary="Service and Redis health",
    tags=["health"],
    responses={503: {"model": Health, "description": "Redis does not answer (status down)"}},
)
async def health(service: ServiceDep, response: Response) -> Health:
    """Ping Redis and report its configuration warnings and this node's data-loss events."""
    try:
        redis = await service.redis(service.inspector.redis_health())
    except PrqError as exc:
        logger.warning("health: redis did not answer error=%s", exc)
        redis = _down("Redis did not answer")
    if not redis.ok:
        if redis.error:
            logger.warning("health: redis not ok error=%s", redis.error)
        redis = redis.model_copy(update={"error": "Redis did not answer"})
        state: Literal["ok", "degraded", "down"] = "down"
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    else:
        state = "degraded" if redis.warnings else "ok"
    return Health(
        status=state,
        version=service.version,
        redis=redis,
        data_loss_events=service.queue.stats.data_loss_events,
        node_id=service.queue.node_id,
    )


@router.get(
    "/api/whoami",
    response_model=WhoAmI,
    summary="The role of the presented token",
    tags=["auth"],
    responses=error_responses(401),
)
async def whoami(role: Annotated[Role, Depends(require_read)]) -> WhoAmI:
    """`admin` or `read`; 401 without a valid token."""
    return WhoAmI(role=role)
