"""BlockingSender: the sender's API of Queue (call, queue_and_wait, send, notify, cancel,
status).

The hot path of a call (call → queue_and_wait → _enqueue_and_wait → BlockingDriver._run) lives
here. `send`'s handle and callbacks are prq.facade.send's; each send waits for its outcome in
a thread of its own.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from functools import partial

from pydantic import JsonValue

from prq.core.lifecycle import RequestStatus
from prq.core.models import Delivery, Request, Response
from prq.facade.blocking_queue.driver import BlockingDriver
from prq.facade.send import BlockingSendHandle, OnFailure, OnResponse, SendState
from prq.observe import metrics, tracing
from prq.protocol.flows.call import call_flow
from prq.protocol.flows.cancel import cancel_flow
from prq.protocol.flows.status import status_flow

__all__ = ["BlockingSender"]


class BlockingSender(BlockingDriver):
    """Queue's sender's API (a mixin over BlockingDriver's state and flow driver)."""

    def queue_and_wait(
        self,
        request: Request,
        *,
        pickup_timeout_s: float | None = None,
        timeout_s: float | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> Response:
        """Enqueue `request` and wait for its response (an error response is returned).
        `on_progress(bytes_read, bytes_in_all)` reports, from the receiver's heartbeats, how
        far it has read the request's DataStreams (keep it short: it runs on the node's
        heartbeat turn)."""
        return self._queue_and_wait(request, pickup_timeout_s, timeout_s, on_progress=on_progress)

    def _queue_and_wait(
        self,
        request: Request,
        pickup_timeout_s: float | None,
        timeout_s: float | None,
        on_enqueued: Callable[[], None] | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> Response:
        request, traced = tracing.sending(request, self.node_id, call=True)
        with traced:
            response = self._enqueue_and_wait(
                request, pickup_timeout_s, timeout_s, traced.then(on_enqueued), on_progress
            )
            return traced.answered(response)

    def _enqueue_and_wait(
        self,
        request: Request,
        pickup_timeout_s: float | None,
        timeout_s: float | None,
        on_enqueued: Callable[[], None] | None,
        on_progress: Callable[[int, int], None] | None,
    ) -> Response:
        request = self._streams.store_request(request, self._pickup_timeout(pickup_timeout_s))
        request, body = self._encode_request(request)
        self._ready()
        self._listen(request.endpoint)
        if self._streams.spills(body):
            body = self._streams.spill_request(
                request, body, self._pickup_timeout(pickup_timeout_s)
            )
        self._sending(request, on_progress)
        mark = self._watch.mark(request.endpoint)
        started = time.perf_counter()
        try:
            with self._router.watch_response(request.id) as signal:
                flow = call_flow(
                    self.ctx,
                    request,
                    body,
                    signal,
                    self._pickup_timeout(pickup_timeout_s),
                    timeout_s,
                    partial(self._enqueued, mark, then=on_enqueued),
                    partial(self._redelivered, request.endpoint),
                    register=self._first_use(request.endpoint),
                    layout=self._check_layout_flow(request.endpoint),
                    stamps=self._watch.stamps(mark),
                )
                response = self._run(flow, mark)
        except BaseException as exc:
            metrics.call_ended(request.endpoint, started, None, exc)
            if self._data_spent(request, body, exc):
                self._streams.delete_request_data(request, body)
            raise
        finally:
            self._watch.liveness.release(request.id)
        metrics.call_ended(request.endpoint, started, response, None)
        self._streams.bind(response.streams, delete_after_read=True)
        return response

    def send(
        self,
        request: Request,
        *,
        on_response: OnResponse,
        on_failure: OnFailure,
        pickup_timeout_s: float | None = None,
        timeout_s: float | None = None,
    ) -> BlockingSendHandle:
        """Enqueue `request` and return once it is in Redis; exactly one of
        `on_response(response)` and `on_failure(error)` runs later (in a thread of its own,
        which waits for the outcome), exactly once, unless `handle.withdraw()` withdraws the
        request before pickup (then neither). See prq.facade.send."""
        request = self._streams.store_request(request, self._pickup_timeout(pickup_timeout_s))
        request, _ = self._encode_request(request)  # a bad request raises here, not later
        self._ready()
        self._listen(request.endpoint)
        handle = BlockingSendHandle(self, SendState(request, on_response, on_failure))
        # (in the caller's context: its current span is the parent of the call's spans)
        thread = threading.Thread(
            target=contextvars.copy_context().run,
            args=(handle._run, pickup_timeout_s, timeout_s),
            name="prq-send",
            daemon=True,
        )
        handle._thread = thread
        thread.start()
        handle._enqueued.wait(self.settings.retry_budget_s + 30)  # bounded: the thread ends
        return handle

    def notify(
        self,
        endpoint: str,
        method: str,
        params: JsonValue = None,
        *,
        service: str = "",
        priority: int = 0,
        producer: str | None = None,
        request_id: str | None = None,
        delivery: Delivery = "at_most_once",
        pickup_timeout_s: float | None = None,
    ) -> str:
        """Send a one-way message: queued like any request (idempotent by id), run by a
        receiver, and no response kept. Returns the request id once it is in Redis."""
        request = self.build_request(
            endpoint, method, params, service=service, priority=priority, producer=producer,
            request_id=request_id, delivery=delivery,
        )  # fmt: skip
        request, traced = tracing.sending(request, self.node_id)
        with traced:
            request, body = self._encode_request(request)
            self._ready()
            if self._streams.spills(body):
                body = self._streams.spill_request(
                    request, body, self._pickup_timeout(pickup_timeout_s)
                )
            return self._run(self._notify_flow(request, body, pickup_timeout_s))

    def call(
        self,
        endpoint: str,
        method: str,
        params: JsonValue = None,
        *,
        service: str = "",
        priority: int = 0,
        producer: str | None = None,
        request_id: str | None = None,
        pickup_timeout_s: float | None = None,
        timeout_s: float | None = None,
    ) -> JsonValue:
        """Call `method` on the service at `endpoint`; return its result or raise RemoteError."""
        request = self.build_request(
            endpoint,
            method,
            params,
            service=service,
            priority=priority,
            producer=producer,
            request_id=request_id,
        )
        response = self.queue_and_wait(
            request, pickup_timeout_s=pickup_timeout_s, timeout_s=timeout_s
        )
        return self._result(request, response)

    def cancel(self, request_id: str) -> bool:
        """Withdraw a request not yet picked up (from any node); True if this call withdrew it."""
        self._ready()
        return self._run(
            cancel_flow(
                self.ctx, request_id, self._sent_endpoint(request_id), on_cancelled=self._cancelled
            )
        )

    def status(self, request_id: str) -> RequestStatus:
        """Where a request stands (any node can ask)."""
        self._ready()
        return self._run(status_flow(self.ctx, request_id, self._sent_endpoint(request_id)))
