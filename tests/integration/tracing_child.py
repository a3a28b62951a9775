"""A node in another OS process that traces with the OpenTelemetry SDK's in-memory exporter.

Run as `python tracing_child.py <serve|call> <url> <prefix> <endpoint> <async|sync> <n>`.

- serve: prints "ready", serves `endpoint` until its handler ran `n` times, then prints its
  finished spans. The handler opens a span "handler work" (to show where it runs), raises
  ValueError for method "fail", and answers the headers its request carried.
- call: inside a span "client", calls the endpoint (method "work", then "fail"), sends one
  request, notifies one, calls with a malformed traceparent of its own, and enqueues one
  through BulkClient; prints the request ids, what came back, and its finished spans.

The last stdout line is a JSON object; spans are dicts (see `span_dict`).
"""

from __future__ import annotations

import asyncio
import json
import queue as queue_module
import sys
import threading
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from prq import AsyncQueue, Queue, QueueSettings, RemoteError, Request, Response
from prq.bulk import BulkClient

EXPORTER = InMemorySpanExporter()
SETTINGS = QueueSettings(poll_interval_s=0.5, dequeue_timeout_s=1.0)
#: A traceparent no propagator accepts.
MALFORMED = "00-not-a-trace-id-zz"
#: Longest wait for a send's callback, seconds (a bound, not a synchronisation).
WAIT_S = 30.0


def setup() -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)


def span_dict(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent": f"{span.parent.span_id:016x}" if span.parent is not None else None,
        "kind": span.kind.name,
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "events": [event.name for event in span.events],
        "start": span.start_time,
        "end": span.end_time,
    }


def spans() -> list[dict[str, Any]]:
    return [span_dict(span) for span in EXPORTER.get_finished_spans()]


# -- serve ----------------------------------------------------------------------------------------


class Handler:
    def __init__(self, n: int, done: Any) -> None:
        self.left = n
        self.done = done
        self.lock = threading.Lock()

    def __call__(self, request: Request) -> Any:
        try:
            with trace.get_tracer("test").start_as_current_span("handler work"):
                if request.method == "fail":
                    raise ValueError("asked to fail")
                return {"headers": request.headers}
        finally:
            with self.lock:
                self.left -= 1
                if self.left == 0:
                    self.done()


def serve(url: str, prefix: str, endpoint: str, facade: str, n: int) -> dict[str, Any]:
    if facade == "sync":
        stop = threading.Event()
        with Queue.from_url(url, prefix=prefix, settings=SETTINGS) as queue:
            print("ready", flush=True)
            queue.serve(endpoint, Handler(n, stop.set), stop=stop)
    else:

        async def run() -> None:
            loop = asyncio.get_running_loop()
            stop = asyncio.Event()
            async with AsyncQueue.from_url(url, prefix=prefix, settings=SETTINGS) as queue:
                print("ready", flush=True)
                handler = Handler(n, lambda: loop.call_soon_threadsafe(stop.set))
                await queue.serve(endpoint, handler, stop=stop)

        asyncio.run(run())
    return {"spans": spans()}


# -- call -----------------------------------------------------------------------------------------


def call_sync(url: str, prefix: str, endpoint: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with Queue.from_url(url, prefix=prefix, settings=SETTINGS) as queue:
        out["work"] = queue.call(endpoint, "work", request_id="call-work")
        try:
            queue.call(endpoint, "fail", request_id="call-fail")
        except RemoteError as exc:
            out["fail"] = exc.error.type
        got: queue_module.Queue[Response] = queue_module.Queue()
        request = Request(endpoint=endpoint, method="work", id="sent")
        queue.send(request, on_response=got.put, on_failure=print)
        out["sent"] = got.get(timeout=WAIT_S).result
        queue.notify(endpoint, "work", request_id="notified")
        odd = Request(
            endpoint=endpoint, method="work", id="malformed", headers={"traceparent": MALFORMED}
        )
        out["malformed"] = queue.queue_and_wait(odd).result
    return out


async def call_async(url: str, prefix: str, endpoint: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with AsyncQueue.from_url(url, prefix=prefix, settings=SETTINGS) as queue:
        out["work"] = await queue.call(endpoint, "work", request_id="call-work")
        try:
            await queue.call(endpoint, "fail", request_id="call-fail")
        except RemoteError as exc:
            out["fail"] = exc.error.type
        answered: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        request = Request(endpoint=endpoint, method="work", id="sent")
        await queue.send(request, on_response=answered.set_result, on_failure=print)
        out["sent"] = (await asyncio.wait_for(answered, WAIT_S)).result
        await queue.notify(endpoint, "work", request_id="notified")
        odd = Request(
            endpoint=endpoint, method="work", id="malformed", headers={"traceparent": MALFORMED}
        )
        out["malformed"] = (await queue.queue_and_wait(odd)).result
    return out


def call(url: str, prefix: str, endpoint: str, facade: str) -> dict[str, Any]:
    with trace.get_tracer("test").start_as_current_span("client"):
        if facade == "sync":
            out = call_sync(url, prefix, endpoint)
        else:
            out = asyncio.run(call_async(url, prefix, endpoint))
        with BulkClient.from_url(url, prefix=prefix) as bulk:
            result = bulk.enqueue_many([Request(endpoint=endpoint, method="work", id="bulk")])
            out["bulk"] = result.accepted
    return {"out": out, "spans": spans()}


def main(argv: list[str]) -> int:
    role, url, prefix, endpoint, facade, n = argv
    setup()
    if role == "serve":
        result = serve(url, prefix, endpoint, facade, int(n))
    else:
        result = call(url, prefix, endpoint, facade)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
