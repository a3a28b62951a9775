"""`create_app`: the admin service as a FastAPI app (the caller runs it, e.g. under uvicorn).

While the app runs (its lifespan), it owns one prq queue node (status, cancel, limit changes
and dead-letter replays and purges go through it; its data-loss watch feeds `/health`), one
`Inspector` (read-only views of Redis), and a background sampler of enqueue counters for the
throughput chart. The node is started in the background (`_start_node`), so the service
listens at once even while Redis does not answer: `/health` says 503 meanwhile, and turns 200
once Redis answers, without a restart. Shutdown stops the sampler (bounded) and closes the
inspector and the node.

Every route but `/health` and the dashboard shell needs a bearer token (`api.auth`), the
OpenAPI document included (`/openapi.json`). Errors share one JSON shape (`api.errors`); request
bodies are limited (`api.body_limit`); CORS is off unless exact origins are configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware

import prq
from api.auth import TokenChecker, require_read
from api.body_limit import BodySizeLimit
from api.deps import Service
from api.errors import install_error_handlers
from api.routes import dead_letters, endpoints, health, limits, metrics, requests
from api.routes.dashboard import mount_dashboard
from api.settings import ApiSettings
from api.throughput import ReadTotals, ThroughputSampler
from prq.core.config import QueueSettings
from prq.core.errors import ConfigurationError, PrqError, QueueShutdown
from prq.facade.asyncio_queue import AsyncQueue
from prq.ops.inspector import Inspector

__all__ = ["create_app", "service_version"]

logger = logging.getLogger(__name__)

#: Where the OpenAPI document is served (behind a token, like the routes it describes).
OPENAPI_PATH = "/openapi.json"
#: Pause between two tries to start the service's node (each try lasts the retry budget).
RESTART_PAUSE_S = 1.0


def service_version() -> str:
    """prq's version, `prq.__version__`: the one place the version is written (the package's
    metadata reads it from there at build time, and an editable install's metadata may be older
    than the code it runs)."""
    return prq.__version__


def _enqueued_totals(inspector: Inspector) -> ReadTotals:
    """Reads every endpoint's enqueue counter (two round trips), for the sampler."""
    return inspector.enqueued_totals


async def _start_node(queue: AsyncQueue) -> None:
    """Start the service's queue node, trying again (each try bounded by the retry budget)
    until Redis answers or the service stops; a refused configuration stops the tries (the
    node then says why on each use)."""
    while True:
        try:
            await queue.start()
        except (ConfigurationError, QueueShutdown) as exc:
            logger.error("admin service: queue node not started error=%s", exc)
            return
        except PrqError as exc:
            logger.warning("admin service: queue node not started yet, trying again error=%s", exc)
            await asyncio.sleep(RESTART_PAUSE_S)
        else:
            return


def create_app(
    settings: ApiSettings | None = None,
    *,
    redis_url: str,
    prefix: str = "prq",
    queue_settings: QueueSettings | None = None,
) -> FastAPI:
    """The admin service for the queue at `redis_url` / `prefix`.

    Raises:
        ConfigurationError: no admin token is configured (PRQ_API_ADMIN_TOKENS).
    """
    settings = settings if settings is not None else ApiSettings()
    if not settings.admin_tokens:
        raise ConfigurationError(
            "the admin service needs at least one admin token: set PRQ_API_ADMIN_TOKENS "
            "(comma-separated, each at least 16 characters)"
        )
    version = service_version()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        queue = AsyncQueue.from_url(redis_url, prefix=prefix, settings=queue_settings)
        inspector = Inspector.from_url(redis_url, prefix=prefix, settings=queue_settings)
        sampler = ThroughputSampler(
            _enqueued_totals(inspector),
            interval_s=settings.sample_interval_s,
            window_s=settings.throughput_window_s,
            max_samples=settings.samples_per_endpoint,
            timeout_s=settings.redis_timeout_s,
        )
        # Not awaited: the service listens at once, whether Redis answers or not; /health says
        # Redis is down meanwhile, and a route that needs the node answers 503 within its bound.
        starting = asyncio.create_task(_start_node(queue), name="prq-api-start")
        sampler.start()
        app.state.service = Service(
            settings=settings,
            queue=queue,
            inspector=inspector,
            sampler=sampler,
            version=version,
        )
        logger.info(
            "admin service started version=%s prefix=%s node_id=%s admin_tokens=%d read_tokens=%d",
            version,
            prefix,
            queue.node_id,
            len(settings.admin_tokens),
            len(settings.read_tokens),
        )
        try:
            yield
        finally:
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
            await sampler.aclose()
            await inspector.aclose()
            await queue.aclose()
            logger.info("admin service stopped node_id=%s", queue.node_id)

    app = FastAPI(
        title="prq admin",
        version=version,
        summary="Health, endpoints, requests and metrics of a prq queue.",
        lifespan=lifespan,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.token_checker = TokenChecker(settings.admin_tokens, settings.read_tokens)
    install_error_handlers(app)
    for area in (health, endpoints, limits, dead_letters, requests, metrics):
        app.include_router(area.router)
    mount_dashboard(app)

    @app.get(OPENAPI_PATH, include_in_schema=False, dependencies=[Depends(require_read)])
    async def openapi() -> dict[str, Any]:
        return app.openapi()

    app.add_middleware(BodySizeLimit, max_body_bytes=settings.max_body_bytes)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST", "PUT", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
            allow_credentials=False,
            max_age=600,
        )
    return app
