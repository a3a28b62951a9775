"""An endpoint's dead letters (prq.protocol.dead): list them (any valid token), replay one or purge
them (admin token). The listing goes through the read-only inspector; replay and purge through the
service's own queue node, like cancel.

- `GET /api/dead-letters?endpoint=E&offset=0&limit=100`: newest first.
- `POST /api/dead-letters/replay?endpoint=E` with `{"id": "<request id>"}`: queue it again under
  its id, once: `replayed`, `live` (the id is queued or in flight already) or `missing`.
- `POST /api/dead-letters/purge?endpoint=E` with `{"ids": [...]}` (those) or `{"ids": null}`
  (all of E's): how many were dropped. An empty list drops nothing.
"""

from __future__ import annotations

import logging
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field

from api.auth import require_admin, require_read
from api.deps import MAX_QUEUED_OFFSET, EndpointParams, EndpointQuery, NewWorkQuery, ServiceDep
from api.errors import error_responses
from prq.core.names import REQUEST_ID_PATTERN
from prq.protocol.dead import MAX_LISTED, DeadLetter

__all__ = [
    "DeadLetterParams",
    "PurgeDeadLetters",
    "PurgeResult",
    "ReplayDeadLetter",
    "ReplayResult",
    "router",
]

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/api/dead-letters", tags=["dead letters"])

RequestId = Annotated[
    str,
    Field(
        pattern=REQUEST_ID_PATTERN,
        description="A request id (as the caller's Request.id)",
        examples=["0f8fad5bd9cb469fa16570867728950e"],
    ),
]


class DeadLetterParams(EndpointParams):
    """Query parameters of a page of an endpoint's dead letters."""

    offset: int = Field(0, ge=0, le=MAX_QUEUED_OFFSET, description="How many to skip")
    limit: int = Field(
        100, ge=1, le=MAX_LISTED, description=f"Most dead letters listed (1-{MAX_LISTED})"
    )


DeadLetterQuery = Annotated[DeadLetterParams, Query()]


class ReplayDeadLetter(BaseModel):
    """Which dead letter to queue again."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: RequestId


class ReplayResult(BaseModel):
    """What a replay did: `replayed` (queued again), `live` (the id was queued or in flight
    already: nothing added, the dead letter dropped) or `missing` (no such dead letter)."""

    id: str
    outcome: Literal["replayed", "live", "missing"]


class PurgeDeadLetters(BaseModel):
    """Which dead letters to drop: the listed ids, or all of the endpoint's when null."""

    model_config = ConfigDict(extra="forbid", strict=True)

    ids: list[RequestId] | None = Field(
        ...,
        max_length=MAX_LISTED,
        description=f"Ids to drop (at most {MAX_LISTED}; unknown ones are ignored); null: all",
    )


class PurgeResult(BaseModel):
    """How many dead letters were dropped."""

    purged: int


@router.get(
    "",
    response_model=list[DeadLetter],
    summary="An endpoint's dead letters, newest first",
    dependencies=[Depends(require_read)],
    responses=error_responses(401, 422, 503),
)
async def list_dead_letters(service: ServiceDep, query: DeadLetterQuery) -> list[DeadLetter]:
    """Requests that must not run: id, reason, attempts, when, size and the start of their
    stored bytes as text (never decoded as anything else)."""
    letters = service.inspector.dead_letters(query.endpoint, offset=query.offset, limit=query.limit)
    return await service.redis(letters)


@router.post(
    "/replay",
    response_model=ReplayResult,
    summary="Queue a dead letter again",
    dependencies=[Depends(require_admin)],
    responses=error_responses(400, 401, 403, 413, 422, 503),
)
async def replay_dead_letter(
    service: ServiceDep, query: NewWorkQuery, body: ReplayDeadLetter
) -> ReplayResult:
    """Queue it again under its id with a fresh attempt count and pickup deadline; replaying
    twice yields one live request (the second answers `missing`)."""
    outcome = await service.redis(service.queue.replay_dead_letter(query.endpoint, body.id))
    logger.info("dead letter replay endpoint=%r id=%s outcome=%s", query.endpoint, body.id, outcome)
    return ReplayResult(id=body.id, outcome=outcome)


@router.post(
    "/purge",
    response_model=PurgeResult,
    summary="Drop dead letters",
    dependencies=[Depends(require_admin)],
    responses=error_responses(400, 401, 403, 413, 422, 503),
)
async def purge_dead_letters(
    service: ServiceDep, query: EndpointQuery, body: PurgeDeadLetters
) -> PurgeResult:
    """Drop the named dead letters, or all of the endpoint's for `"ids": null`."""
    purged = await service.redis(service.queue.purge_dead_letters(query.endpoint, body.ids))
    logger.info(
        "dead letters purged endpoint=%r named=%s purged=%d",
        query.endpoint,
        "all" if body.ids is None else len(body.ids),
        purged,
    )
    return PurgeResult(purged=purged)
