"""What routes depend on: the running service (queue node, inspector, sampler) and parameters.

`Service` exists while the app's lifespan runs; routes reach it through `ServiceDep`. Every Redis
read a route makes goes through `Service.redis(...)`, which bounds it by `redis_timeout_s`, so a
Redis that does not answer costs a client a 503 after a few seconds, not a hung request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Annotated, TypeVar

from fastapi import Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from api.errors import RedisTimeout
from api.settings import ApiSettings
from api.throughput import ThroughputSampler
from prq.core.names import MAX_ENDPOINT_LENGTH, REQUEST_ID_PATTERN
from prq.facade.asyncio_queue import AsyncQueue
from prq.ops.inspector import Inspector
from prq.ops.queue_view import MAX_PAGE

__all__ = [
    "ENDPOINT_PATTERN",
    "MAX_QUEUED_OFFSET",
    "NEW_WORK_ENDPOINT_PATTERN",
    "EndpointParams",
    "EndpointQuery",
    "ForgetParams",
    "ForgetQuery",
    "NewWorkParams",
    "NewWorkQuery",
    "QueuedParams",
    "QueuedQuery",
    "RequestIdPath",
    "Service",
    "ServiceDep",
    "get_service",
]

T = TypeVar("T")

#: Endpoint names are 1-200 printable characters (`str.isprintable`). JSON Schema cannot say
#: "printable" exactly, so the pattern refuses the control characters; the few other
#: non-printable characters (e.g. U+200B) pass the pattern and are refused with 422 by prq.
ENDPOINT_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]+$"

#: A name new work may be sent to (`prq.core.names.validate_endpoint`): the same, and no whitespace
#: at either end (names an earlier version took with it are still read, listed and forgotten).
NEW_WORK_ENDPOINT_PATTERN = (
    r"^[^\s\x00-\x1f\x7f-\x9f](?:[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f])?$"
)

#: Largest offset into an endpoint's queue (a bound on what a client can ask Redis for).
MAX_QUEUED_OFFSET = 2**31 - 1

EndpointName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_ENDPOINT_LENGTH,
        pattern=ENDPOINT_PATTERN,
        description="The endpoint's name, e.g. poll://billing-7 (1-200 printable characters)",
        examples=["poll://billing-7"],
    ),
]


NewWorkEndpointName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_ENDPOINT_LENGTH,
        pattern=NEW_WORK_ENDPOINT_PATTERN,
        description=(
            "The endpoint's name, e.g. poll://billing-7 (1-200 printable characters, no "
            "whitespace at either end)"
        ),
        examples=["poll://billing-7"],
    ),
]


class NewWorkParams(BaseModel):
    """Query parameters naming the endpoint of a change that sends it work or configures it
    (a replay, its limits): a name new work may go to."""

    model_config = ConfigDict(extra="forbid")

    endpoint: NewWorkEndpointName


class EndpointParams(BaseModel):
    """Query parameters naming one endpoint (an unknown parameter is refused, not ignored)."""

    model_config = ConfigDict(extra="forbid")

    endpoint: EndpointName


class QueuedParams(EndpointParams):
    """Query parameters of a page of an endpoint's queued requests."""

    offset: int = Field(0, ge=0, le=MAX_QUEUED_OFFSET, description="How many to skip")
    limit: int = Field(50, ge=1, le=MAX_PAGE, description=f"Most items in the page (1-{MAX_PAGE})")


class ForgetParams(EndpointParams):
    """Query parameters of forgetting an endpoint."""

    force: bool = Field(
        False, description="Forget it even while it holds work or has a live receiver"
    )


EndpointQuery = Annotated[EndpointParams, Query()]
NewWorkQuery = Annotated[NewWorkParams, Query()]
ForgetQuery = Annotated[ForgetParams, Query()]
QueuedQuery = Annotated[QueuedParams, Query()]

RequestIdPath = Annotated[
    str,
    Path(
        pattern=REQUEST_ID_PATTERN,
        description="The request's id (as the caller's Request.id)",
        examples=["0f8fad5bd9cb469fa16570867728950e"],
    ),
]


@dataclass(frozen=True, slots=True)
class Service:
    """The parts of a running admin service that routes use."""

    settings: ApiSettings
    queue: AsyncQueue
    inspector: Inspector
    sampler: ThroughputSampler
    version: str

    async def redis(self, operation: Awaitable[T]) -> T:
        """Await a Redis-backed operation, at most `redis_timeout_s` (else RedisTimeout)."""
        try:
            async with asyncio.timeout(self.settings.redis_timeout_s):
                return await operation
        except TimeoutError as exc:
            raise RedisTimeout(
                f"Redis did not answer within {self.settings.redis_timeout_s:g} s; "
                "try again in a moment"
            ) from exc


def get_service(request: Request) -> Service:
    """The service of the running app (set by its lifespan)."""
    service: Service = request.app.state.service
    return service


ServiceDep = Annotated[Service, Depends(get_service)]
