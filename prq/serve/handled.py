"""What a handler's run becomes: the response its caller gets, and, when it failed, what the
receiver keeps of the failure.

A handler that raises, or returns something that is not JSON, ends its call with a
`ServerError`. What the caller sees of it is chosen here, deliberately:

- `type`: the exception's class name (`SerializationError` for a result that is not JSON);
- `message`: `str(exc)`;
- `retryable`: the exception's own `retryable` attribute, False when it has none;
- `details`: `{"receiver": <node id>}`, so that the caller (or its operator) knows which
  node's log holds the traceback, plus `"details"`: the exception's own `details` attribute
  when it defines one that is JSON. A handler decides what more its caller may see by raising
  an exception that carries it.

The traceback never leaves the receiver: it may name files, arguments and secrets of the node
that ran the handler. The receiver logs it (logger `prq.serve.handled`, ERROR) with the request id,
endpoint and method, at most once per endpoint and error type per LOG_EVERY_S; the failures
in between are logged at DEBUG without a traceback and counted in the next ERROR line. Every
failure is counted in `prq_handler_errors_total{endpoint,error}`.
"""

from __future__ import annotations

import contextlib
import logging
from typing import cast

from pydantic import JsonValue, TypeAdapter, ValidationError

from prq.core.errors import ServerError
from prq.core.lifecycle import PendingRequest
from prq.core.models import Response
from prq.observe.metrics import HANDLER_ERRORS
from prq.observe.throttle import LogThrottle

logger = logging.getLogger(__name__)

__all__ = ["LOG_EVERY_S", "build_response", "handler_response"]

#: A receiver logs the traceback of a handler's failure at most once per endpoint and error
#: type per this many seconds (the rest at DEBUG, counted in the next one).
LOG_EVERY_S = 10.0

_JSON: TypeAdapter[JsonValue] = TypeAdapter(JsonValue)


def build_response(
    request_id: str, result: object = None, exc: BaseException | None = None
) -> Response:
    """The response for a handler's result or exception (a non-JSON result is an error; a
    Response is sent as it is, under the request's id)."""
    if exc is not None:
        return Response(
            id=request_id,
            error=ServerError(
                type=type(exc).__name__,
                message=str(exc),
                retryable=bool(getattr(exc, "retryable", False)),
            ),
        )
    if isinstance(result, Response):  # the handler built it (e.g. to send DataStreams)
        return result.model_copy(update={"id": request_id})
    try:
        return Response(id=request_id, result=cast(JsonValue, result))
    except ValidationError as error:
        return Response(
            id=request_id,
            error=ServerError(
                type="SerializationError",
                message="the handler returned a value that is not JSON: "
                + str(error.errors()[0]["msg"]),
            ),
        )


def handler_response(
    node_id: str, pending: PendingRequest, result: object, exc: Exception | None
) -> Response:
    """The response to send for one handler run (its `result`, or the `exc` it raised); a
    failure is logged, counted and given the details its caller may see (module docstring)."""
    response = build_response(pending.id, result, exc)
    error = response.error
    if error is None:
        return response
    if exc is None and isinstance(result, Response):
        return response  # the handler chose its error itself: not a failure of the handler
    details: dict[str, JsonValue] = {"receiver": node_id}
    own = getattr(exc, "details", None) if exc is not None else None
    if own is not None:
        with contextlib.suppress(ValidationError):  # not JSON: the caller gets the rest
            details["details"] = _JSON.validate_python(own)
    _report(pending, error.type, exc)
    return response.model_copy(update={"error": error.model_copy(update={"details": details})})


#: Which failures get a traceback in the log: the first of each key per LOG_EVERY_S.
_throttle = LogThrottle(LOG_EVERY_S)


def _report(pending: PendingRequest, error_type: str, exc: Exception | None) -> None:
    request = pending.request
    HANDLER_ERRORS.labels(request.endpoint, error_type).inc()
    quiet = _throttle.admit((request.endpoint, error_type))
    if quiet is None:
        logger.debug(
            "handler failed request_id=%s endpoint=%r method=%r error=%s",
            pending.id, request.endpoint, request.method, error_type,
        )  # fmt: skip
        return
    logger.error(
        "handler failed request_id=%s endpoint=%r method=%r error=%s%s",
        pending.id, request.endpoint, request.method, error_type,
        f" ({quiet} more failures of this kind in the last {LOG_EVERY_S:g} s, at DEBUG)"
        if quiet else "",
        exc_info=exc,
    )  # fmt: skip
