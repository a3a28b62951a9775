"""Every error the admin service answers has one JSON shape: `{"error": {"type", "message"}}`.

- HTTP errors (401, 403, 404, 405, 413, ...) keep their status and headers; a 405's `Allow`
  lists the methods of every route on the path (Starlette names only the first route's).
- A request body that cannot be read as text (e.g. not UTF-8) → 400 `bad_request`.
- Request validation → 422 `validation_error`, naming the parameter, never echoing its value.
- prq errors: `InvalidEndpoint`, `InvalidRequest` and pydantic validation → 422;
  `PayloadTooLarge` → 413; `QueueUnavailable` / `QueueShutdown` / a Redis wait past its bound
  → 503; anything else → 500 with a generic message (the details go to the log, not to the client).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from http import HTTPStatus
from typing import Any

import fastapi.routing
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from prq.core.errors import (
    InvalidEndpoint,
    InvalidRequest,
    InvalidSettings,
    PayloadTooLarge,
    PrqError,
    QueueShutdown,
    QueueUnavailable,
)

__all__ = [
    "ErrorBody",
    "ErrorDetail",
    "RedisTimeout",
    "error_response",
    "error_responses",
    "install_error_handlers",
]

logger = logging.getLogger(__name__)

#: The `type` of an HTTP error, by status.
_HTTP_TYPES: Mapping[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    422: "validation_error",
    503: "unavailable",
}

#: What each declared error status means, for the OpenAPI document.
_DESCRIPTIONS: Mapping[int, str] = {
    400: "The request body is not JSON text (e.g. not UTF-8)",
    401: "No valid bearer token",
    403: "The token is read-only and the route changes something",
    404: "Nothing is known under this id",
    409: "The endpoint holds work or has a live receiver (forget it with force=true)",
    413: "The request body is over max_body_bytes",
    422: "A parameter is invalid (e.g. an endpoint name that is not 1-200 printable characters)",
    503: "Redis did not answer in time",
}


class ErrorDetail(BaseModel):
    """What went wrong: a stable machine-readable `type` and a message for people."""

    type: str
    message: str


class ErrorBody(BaseModel):
    """The body of every error response."""

    error: ErrorDetail


class RedisTimeout(PrqError):
    """Redis did not answer within the service's `redis_timeout_s` (answered as 503)."""

    retryable = True


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for these error statuses, all with the error model."""
    return {code: {"model": ErrorBody, "description": _DESCRIPTIONS[code]} for code in statuses}


def error_response(
    status_code: int,
    error_type: str,
    message: str,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """A JSON error response in the service's one shape."""
    body = ErrorBody(error=ErrorDetail(type=error_type, message=message))
    return JSONResponse(body.model_dump(), status_code=status_code, headers=headers)


def _http_message(exc: StarletteHTTPException) -> str:
    if isinstance(exc.detail, str) and exc.detail:
        return exc.detail
    return HTTPStatus(exc.status_code).phrase


def _routes(app: FastAPI) -> Iterable[object]:
    """Every route of `app`, those of included routers too (recent FastAPI keeps an included
    router as one entry of `app.routes`; `iter_route_contexts` opens it)."""
    contexts = getattr(fastapi.routing, "iter_route_contexts", None)
    return contexts(app.router.routes) if contexts is not None else app.router.routes


def _allowed_methods(request: Request) -> set[str]:
    """The methods of every route whose path matches the request's."""
    path = request.scope.get("path", request.url.path)
    allowed: set[str] = set()
    for route in _routes(request.app):
        regex = getattr(route, "path_regex", None)
        methods = getattr(route, "methods", None)
        if regex is not None and methods and regex.match(path):
            allowed |= set(methods)
    return allowed


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    error_type = _HTTP_TYPES.get(exc.status_code, "http_error")
    headers = exc.headers
    if exc.status_code == 405:
        allowed = _allowed_methods(request)
        if allowed:
            headers = {**(headers or {}), "Allow": ", ".join(sorted(allowed))}
    return error_response(exc.status_code, error_type, _http_message(exc), headers)


def _location(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError | ValidationError)
    # Name the parameter and the rule; never the value (it could be anything, even a secret).
    problems = "; ".join(f"{_location(e['loc'])}: {e['msg']}" for e in exc.errors()[:10])
    return error_response(422, "validation_error", problems or "invalid request")


async def _prq_error(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, InvalidEndpoint):
        return error_response(422, "invalid_endpoint", str(exc))
    if isinstance(exc, InvalidRequest):
        return error_response(422, "invalid_request", str(exc))
    if isinstance(exc, InvalidSettings):
        return error_response(422, "invalid_settings", str(exc))
    if isinstance(exc, PayloadTooLarge):
        return error_response(413, "payload_too_large", str(exc))
    if isinstance(exc, RedisTimeout):
        return error_response(503, "redis_timeout", str(exc))
    if isinstance(exc, QueueUnavailable | QueueShutdown):
        logger.warning("redis unavailable path=%s error=%s", request.url.path, exc)
        return error_response(
            503, "queue_unavailable", "Redis is not answering; try again in a moment"
        )
    logger.error("prq error path=%s", request.url.path, exc_info=exc)
    return _internal()


def _internal() -> JSONResponse:
    return error_response(
        500, "internal_error", "the admin service failed; the details are in its log"
    )


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    # Starlette logs the traceback (it re-raises after this response is sent).
    return _internal()


def install_error_handlers(app: FastAPI) -> None:
    """Route every error the app can raise to the one JSON shape."""
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(ValidationError, _validation_error)
    app.add_exception_handler(PrqError, _prq_error)
    app.add_exception_handler(Exception, _unexpected_error)
