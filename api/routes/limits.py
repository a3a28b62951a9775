"""An endpoint's capacity limits (prq.protocol.limits): read them (any valid token) and replace them
(admin token). Reads go through the inspector (a malformed stored value shows as null);
changes through the service's own queue node, like cancel.

`PUT` replaces both limits at once: a field left out or null means no limit, so
`{"max_in_flight": 3}` also removes a max_pending set before.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Depends
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from api.auth import require_admin, require_read
from api.deps import EndpointQuery, NewWorkQuery, ServiceDep
from api.errors import error_responses
from prq.protocol.limits import MAX_LIMIT, EndpointLimits

__all__ = ["NewLimits", "router"]

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/api/endpoint", tags=["limits"])


def _integral(value: object) -> object:
    """JSON has one number type: 3.0 is the integer 3 (as JSON Schema's "integer" says)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Limit = Annotated[
    int,
    Field(ge=1, le=MAX_LIMIT, description="A positive integer; null or left out: no limit"),
    BeforeValidator(_integral),
]


class NewLimits(BaseModel):
    """The limits an endpoint gets; each null or left out means no limit.

    Strict: a limit must be a JSON integer (3 or 3.0; not "3", 3.5 or true); unknown fields are
    refused.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    max_in_flight: Limit | None = Field(
        None, description="Most requests picked up and unanswered at once, across receivers"
    )
    max_pending: Limit | None = Field(
        None, description="Most requests queued at once; enqueues beyond it fail with QueueFull"
    )


@router.get(
    "/limits",
    response_model=EndpointLimits,
    summary="An endpoint's capacity limits",
    dependencies=[Depends(require_read)],
    responses=error_responses(401, 422, 503),
)
async def get_limits(service: ServiceDep, query: EndpointQuery) -> EndpointLimits:
    """max_in_flight and max_pending as every node applies them (null: no limit)."""
    return await service.redis(service.inspector.limits(query.endpoint))


@router.put(
    "/limits",
    response_model=EndpointLimits,
    summary="Replace an endpoint's capacity limits",
    dependencies=[Depends(require_admin)],
    responses=error_responses(400, 401, 403, 413, 422, 503),
)
async def put_limits(service: ServiceDep, query: NewWorkQuery, body: NewLimits) -> EndpointLimits:
    """Set both limits at once (null or left out: no limit) and return what Redis holds after.

    Every node applies them from its next enqueue or take on.
    """
    limits = await service.redis(
        service.queue.set_limits(
            query.endpoint, max_in_flight=body.max_in_flight, max_pending=body.max_pending
        )
    )
    logger.info(
        "limits set endpoint=%r max_in_flight=%s max_pending=%s",
        limits.endpoint,
        limits.max_in_flight,
        limits.max_pending,
    )
    return limits
