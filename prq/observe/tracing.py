"""Distributed tracing: W3C trace context in `Request.headers`, and OpenTelemetry spans.

OpenTelemetry is optional (`pip install 'prq[otel]'`): this module never imports it. It looks
for it in `sys.modules`, where an application that traces has put it (it configured a tracer
provider, or started a span, so it imported `opentelemetry.trace`). A process that never
imported it pays one dictionary lookup per request; one that imported it but configured no
tracer provider and is in no span pays a check of both (no span, no header is made). (redis-py
8 imports it by itself wherever it is installed: then only the second case is met.) Without a
provider, a request that carries a trace context is still handled in it, so the calls its
handler makes pass it on.

What happens once tracing is on (the span names and attributes follow the OpenTelemetry
messaging conventions; `messaging.system` is "prq", the destination is the endpoint):

- a caller's `call`/`queue_and_wait`/`send` is a CLIENT span "call <endpoint>" (enqueue and
  the wait for the answer; status ERROR when it fails or the service answered an error)
  around a PRODUCER span "send <endpoint>" (the enqueue, until Redis answered); `notify` is
  only the PRODUCER span, a `BulkClient.enqueue_many` one PRODUCER span "send" for all its
  requests. The send span's context is injected into the request's headers (`traceparent`,
  `tracestate`, with the globally configured propagator); headers the caller set win, and a
  request that carries its own `traceparent` is sent as it is (its spans are made in the
  trace it names, or in the current one when it names none that is valid). Spark jobs carry
  the driver's current context (SparkQueueConfig.for_run).
- a receiver records, at pickup, a span "queued <endpoint>" from the request's creation (the
  sender's clock) to its pickup, child of the propagated context; `serve` runs the handler
  and writes its answer inside a CONSUMER span "process <endpoint>", child of the same
  context, made current (spans the handler starts are its children, and calls it makes carry
  it on). A handler's exception is recorded on it, status ERROR. A missing or malformed
  `traceparent` starts a fresh trace there.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from contextvars import Token
from types import TracebackType
from typing import TYPE_CHECKING, Any

from prq.core.lifecycle import PendingRequest
from prq.core.models import Request, Response

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

__all__ = [
    "Processing",
    "Sending",
    "carrier",
    "picked_up",
    "processing",
    "sending",
    "sending_batch",
    "with_trace",
]

#: The module whose presence says the process uses OpenTelemetry.
OTEL_TRACE_MODULE = "opentelemetry.trace"
#: The environment variable that names a tracer provider for the API to load.
OTEL_PYTHON_TRACER_PROVIDER = "OTEL_PYTHON_TRACER_PROVIDER"
_UNKNOWN = object()
#: The header that names a request's parent span (W3C trace context).
TRACEPARENT = "traceparent"
MESSAGING_SYSTEM = "prq"


class _Off:
    """What the facades hold when nothing is traced: every hook does nothing."""

    __slots__ = ()

    def __enter__(self) -> _Off:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @staticmethod
    def then(on_enqueued: Callable[[], None] | None) -> Callable[[], None] | None:
        return on_enqueued

    @staticmethod
    def answered(response: Response) -> Response:
        return response

    def failed(self, exc: BaseException) -> None:
        return None

    def count(self, messages: int) -> None:
        return None


_OFF = _Off()


class _Otel:
    """The OpenTelemetry API, imported once the application imported it, and prq's tracer."""

    def __init__(self) -> None:
        from opentelemetry import context, propagate, trace

        self.trace = trace
        self.context = context
        self.propagate = propagate
        self.unset = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
        self._tracer: tuple[object, Tracer] | None = None
        #: Whether the environment names a provider for the API to load on first use (read
        #: once: the API reads os.environ at every `get_tracer_provider` until a provider is
        #: set, which costs a request more than the rest of this check).
        self.env_provider = OTEL_PYTHON_TRACER_PROVIDER in os.environ

    def configured(self) -> bool:
        """Whether the application set a tracer provider (spans are recorded). While none is
        set, the API's global for it is read rather than `get_tracer_provider` called (see
        env_provider); an API without that global is asked the public way."""
        provider = getattr(self.trace, "_TRACER_PROVIDER", _UNKNOWN)
        if provider is None and not self.env_provider:
            return False
        if provider is None or provider is _UNKNOWN:
            provider = self.trace.get_tracer_provider()
        return not isinstance(provider, self.unset)

    def active(self) -> bool:
        """Whether a caller's request is traced: a provider is set, or a span is current (its
        context, maybe extracted by a service without a provider, is passed on)."""
        return self.configured() or self.trace.get_current_span().get_span_context().is_valid

    def tracer(self) -> Tracer:
        provider = self.trace.get_tracer_provider()
        cached = self._tracer
        if cached is None or cached[0] is not provider:
            from prq._version import __version__

            cached = self._tracer = (provider, provider.get_tracer("prq", __version__))
        return cached[1]

    def inject(self, parent: Context | None) -> dict[str, str]:
        headers: dict[str, str] = {}
        self.propagate.inject(headers, context=parent)
        return headers


_otel: _Otel | None = None


def _api() -> _Otel | None:
    """The OpenTelemetry API if this process imported it (never imported here)."""
    global _otel
    if _otel is None:
        if OTEL_TRACE_MODULE not in sys.modules:
            return None
        _otel = _Otel()
    return _otel


def _attributes(operation: str, endpoint: str | None, **more: Any) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.name": operation,
        "messaging.operation.type": "receive" if operation == "queued" else operation,
    }
    if endpoint is not None:
        attributes["messaging.destination.name"] = endpoint
    attributes.update((key, value) for key, value in more.items() if value is not None)
    return attributes


def with_trace(headers: dict[str, str], trace: dict[str, str]) -> dict[str, str]:
    """`headers` with the trace context `trace` added, unless they name a parent already (the
    caller's wins, and its tracestate must not be mixed with another parent's)."""
    if not trace or TRACEPARENT in headers:
        return headers
    return {**trace, **headers}


def _error(span: Span, otel: _Otel, exc: BaseException) -> None:
    span.record_exception(exc)
    span.set_attribute("error.type", type(exc).__name__)
    span.set_status(otel.trace.Status(otel.trace.StatusCode.ERROR, f"{type(exc).__name__}"))


# -- the caller -------------------------------------------------------------------------------


class Sending:
    """The spans of one enqueue (and, for a call, of the wait for its answer): a context
    manager that ends them, recording an exception that leaves it."""

    def __init__(self, otel: _Otel, request: Request, call: bool, node_id: str) -> None:
        self.otel = otel
        tracer = otel.tracer()
        trace = otel.trace
        parent: Context | None = None  # (the current context)
        if TRACEPARENT in request.headers:  # the caller named the parent itself
            named = otel.propagate.extract(request.headers)
            if trace.get_current_span(named).get_span_context().is_valid:
                parent = named
        attributes = _attributes(
            "send", request.endpoint, **{"messaging.message.id": request.id,
                                         "messaging.client.id": node_id,
                                         "prq.method": request.method},
        )  # fmt: skip
        self.call: Span | None = None
        if call:
            self.call = tracer.start_span(
                f"call {request.endpoint}", parent, trace.SpanKind.CLIENT, attributes
            )
            parent = trace.set_span_in_context(self.call, parent)
        self.send: Span | None = tracer.start_span(
            f"send {request.endpoint}", parent, trace.SpanKind.PRODUCER, attributes
        )
        self.headers = otel.inject(trace.set_span_in_context(self.send, parent))

    def then(self, on_enqueued: Callable[[], None] | None) -> Callable[[], None]:
        """`on_enqueued`, ending the send span first (Redis took the request)."""

        def enqueued() -> None:
            self._end_send(None)
            if on_enqueued is not None:
                on_enqueued()

        return enqueued

    def answered(self, response: Response) -> Response:
        """Mark the call span when the service answered an error; returns `response`."""
        if self.call is not None and response.error is not None:
            self.call.set_attribute("error.type", response.error.type)
            status = self.otel.trace.Status(self.otel.trace.StatusCode.ERROR, response.error.type)
            self.call.set_status(status)
        return response

    def count(self, messages: int) -> None:
        """A batch's size (messaging.batch.message_count)."""
        if self.send is not None:
            self.send.set_attribute("messaging.batch.message_count", messages)

    def _end_send(self, exc: BaseException | None) -> None:
        send, self.send = self.send, None
        if send is not None:
            if exc is not None:
                _error(send, self.otel, exc)
            send.end()

    def __enter__(self) -> Sending:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._end_send(exc)
        if self.call is not None:
            if exc is not None:
                _error(self.call, self.otel, exc)
            self.call.end()


def sending(
    request: Request, node_id: str, *, call: bool = False
) -> tuple[Request, Sending | _Off]:
    """`request` with the caller's trace context in its headers, and the spans of its enqueue
    (a context manager: use `then(on_enqueued)` and `answered(response)` for a call); when
    nothing is traced, `request` as it is and hooks that do nothing."""
    otel = _api()
    if otel is None or not otel.active():
        return request, _OFF
    traced = Sending(otel, request, call, node_id)
    headers = with_trace(request.headers, traced.headers)
    if headers is not request.headers:
        request = request.model_copy(update={"headers": headers})
    return request, traced


def sending_batch() -> tuple[dict[str, str], Sending | _Off]:
    """The trace context for the requests of a batch (BulkClient), and its PRODUCER span "send"
    (use `count(n)`); no context and hooks that do nothing when nothing is traced."""
    otel = _api()
    if otel is None or not otel.active():
        return {}, _OFF
    traced = _BatchSending(otel)
    return traced.headers, traced


class _BatchSending(Sending):
    def __init__(self, otel: _Otel) -> None:  # (no request: the batch's own span)
        self.otel = otel
        self.call = None
        self.send = otel.tracer().start_span(
            "send", None, otel.trace.SpanKind.PRODUCER, _attributes("send", None)
        )
        self.headers = otel.inject(otel.trace.set_span_in_context(self.send))


def carrier() -> tuple[tuple[str, str], ...]:
    """The current trace context as headers (for work sent elsewhere and enqueued there, e.g.
    by Spark executors), or () when no span is current."""
    otel = _api()
    if otel is None or not otel.trace.get_current_span().get_span_context().is_valid:
        return ()
    return tuple(sorted(otel.inject(None).items()))


# -- the receiver -----------------------------------------------------------------------------


def _parent(otel: _Otel, request: Request) -> Context:
    """The propagated context (an empty one, hence a fresh trace, when the headers carry no
    valid traceparent)."""
    from opentelemetry.context import Context

    if TRACEPARENT not in request.headers:
        return Context()
    parent: Context = otel.propagate.extract(request.headers, context=Context())
    return parent


def picked_up(request: Request, created_ms: int, node_id: str) -> None:
    """Record the request's wait in its queue, from its creation to now (its pickup), as a
    span with explicit times, when a tracer provider is set."""
    otel = _api()
    if otel is None or not otel.configured() or created_ms <= 0:
        return
    now_ns = time.time_ns()
    start_ns = min(created_ms * 1_000_000, now_ns)  # (the sender's clock may be ahead)
    span = otel.tracer().start_span(
        f"queued {request.endpoint}",
        _parent(otel, request),
        otel.trace.SpanKind.CONSUMER,
        _attributes("queued", request.endpoint, **{"messaging.message.id": request.id,
                                                   "messaging.client.id": node_id}),
        start_time=start_ns,
    )  # fmt: skip
    span.end(end_time=now_ns)


class Processing:
    """The CONSUMER span around one request's handler and answer, current while it is open."""

    def __init__(self, otel: _Otel, pending: PendingRequest, node_id: str) -> None:
        self.otel = otel
        request = pending.request
        parent = _parent(otel, request)
        attributes = _attributes(
            "process", request.endpoint, **{"messaging.message.id": request.id,
                                            "messaging.client.id": node_id,
                                            "prq.method": request.method,
                                            "prq.attempt": pending.delivery.attempt or None},
        )  # fmt: skip
        self.span = otel.tracer().start_span(
            f"process {request.endpoint}", parent, otel.trace.SpanKind.CONSUMER, attributes
        )
        self._context = otel.trace.set_span_in_context(self.span, parent)
        self._token: Token[Context] | None = None

    def failed(self, exc: BaseException) -> None:
        """The handler raised `exc` (its caller gets it as an error response)."""
        _error(self.span, self.otel, exc)

    def __enter__(self) -> Processing:
        self._token = self.otel.context.attach(self._context)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc is not None:
                _error(self.span, self.otel, exc)
            self.span.end()
        finally:
            if self._token is not None:
                self.otel.context.detach(self._token)


def processing(pending: PendingRequest, node_id: str) -> Processing | _Off:
    """The span to run `pending`'s handler and answer in (a context manager; `failed(exc)`
    records the handler's exception); hooks that do nothing when nothing is traced: no
    tracer provider set and no trace context in the request."""
    otel = _api()
    if otel is None or (TRACEPARENT not in pending.request.headers and not otel.configured()):
        return _OFF
    return Processing(otel, pending, node_id)
