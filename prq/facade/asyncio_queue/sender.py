"""AsyncSender: the sender's API of AsyncQueue (call, queue_and_wait, send, notify, cancel,
status).

The hot path of a call (call → queue_and_wait → _enqueue_and_wait → AsyncDriver._run) lives
here, with the caller's side of giving up (a cancelled caller withdraws its request in the
background). `send`'s handle and callbacks are prq.facade.send's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from functools import partial

from pydantic import JsonValue

from prq.core.lifecycle import RequestStatus
from prq.core.models import Delivery, Request, Response
from prq.facade.asyncio_queue.driver import AsyncDriver
from prq.facade.send import OnFailure, OnResponse, SendHandle, SendState
from prq.observe import metrics, tracing
from prq.protocol.flows.call import call_flow
from prq.protocol.flows.cancel import cancel_flow
from prq.protocol.flows.status import status_flow

logger = logging.getLogger(__name__)

__all__ = ["AsyncSender"]


class AsyncSender(AsyncDriver):
    """AsyncQueue's sender's API (a mixin over AsyncDriver's state and flow driver)."""

    async def queue_and_wait(
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
        return await self._queue_and_wait(
            request, pickup_timeout_s, timeout_s, on_progress=on_progress
        )

    async def _queue_and_wait(
        self,
        request: Request,
        pickup_timeout_s: float | None,
        timeout_s: float | None,
        on_enqueued: Callable[[], None] | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> Response:
        request, traced = tracing.sending(request, self.node_id, call=True)
        with traced:
            response = await self._enqueue_and_wait(
                request, pickup_timeout_s, timeout_s, traced.then(on_enqueued), on_progress
            )
            return traced.answered(response)

    async def _enqueue_and_wait(
        self,
        request: Request,
        pickup_timeout_s: float | None,
        timeout_s: float | None,
        on_enqueued: Callable[[], None] | None,
        on_progress: Callable[[int, int], None] | None,
    ) -> Response:
        request = await self._with_stored_streams(request, pickup_timeout_s)
        request, body = self._encode_request(request)
        await self._ready()
        await self._listen(request.endpoint)
        if self._streams.spills(body):
            body = await asyncio.to_thread(
                self._streams.spill_request, request, body, self._pickup_timeout(pickup_timeout_s)
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
                response = await self._run(flow, mark)
        except BaseException as exc:
            metrics.call_ended(request.endpoint, started, None, exc)
            if isinstance(exc, asyncio.CancelledError):
                self._withdraw_in_background(request)
            elif self._data_spent(request, body, exc):
                await asyncio.to_thread(self._streams.delete_request_data, request, body)
            raise
        finally:
            self._watch.liveness.release(request.id)
        metrics.call_ended(request.endpoint, started, response, None)
        self._streams.bind(response.streams, delete_after_read=True)
        return response

    async def send(
        self,
        request: Request,
        *,
        on_response: OnResponse,
        on_failure: OnFailure,
        pickup_timeout_s: float | None = None,
        timeout_s: float | None = None,
    ) -> SendHandle:
        """Enqueue `request` and return once it is in Redis; exactly one of
        `on_response(response)` and `on_failure(error)` runs later, exactly once, unless
        `handle.withdraw()` withdraws the request before pickup (then neither). See
        prq.facade.send."""
        request = await self._with_stored_streams(request, pickup_timeout_s)
        request, _ = self._encode_request(request)  # a bad request raises here, not later
        await self._ready()
        await self._listen(request.endpoint)
        handle = SendHandle(self, SendState(request, on_response, on_failure))
        task = asyncio.create_task(handle._run(pickup_timeout_s, timeout_s))
        handle._task = task
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        enqueued = asyncio.ensure_future(handle._enqueued.wait())
        await asyncio.wait([task, enqueued], return_when=asyncio.FIRST_COMPLETED)
        enqueued.cancel()
        return handle

    async def notify(
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
            await self._ready()
            if self._streams.spills(body):
                pickup_s = self._pickup_timeout(pickup_timeout_s)
                body = await asyncio.to_thread(self._streams.spill_request, request, body, pickup_s)
            return await self._run(self._notify_flow(request, body, pickup_timeout_s))

    async def _with_stored_streams(
        self, request: Request, pickup_timeout_s: float | None
    ) -> Request:
        """`request` with its DataStreams copied into the store (in a thread: file I/O)."""
        if not self._streams.unstored(request):
            return request
        pickup = self._pickup_timeout(pickup_timeout_s)
        return await asyncio.to_thread(self._streams.store_request, request, pickup)

    def _withdraw_in_background(self, request: Request) -> None:
        """The caller gave up: cancel the request (withdrawn, or its receiver told)."""
        if self._closed:
            return

        async def cancel() -> None:
            try:
                await self._run(cancel_flow(self.ctx, request.id, request.endpoint))
            except Exception as exc:
                logger.debug(
                    "cancel after caller gave up failed request_id=%s error=%s", request.id, exc
                )

        task = asyncio.ensure_future(cancel())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def call(
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
        response = await self.queue_and_wait(
            request, pickup_timeout_s=pickup_timeout_s, timeout_s=timeout_s
        )
        return self._result(request, response)

    async def cancel(self, request_id: str) -> bool:
        """Withdraw a request not yet picked up (from any node); True if this call withdrew it."""
        await self._ready()
        return await self._run(
            cancel_flow(
                self.ctx, request_id, self._sent_endpoint(request_id), on_cancelled=self._cancelled
            )
        )

    async def status(self, request_id: str) -> RequestStatus:
        """Where a request stands (any node can ask)."""
        await self._ready()
        return await self._run(status_flow(self.ctx, request_id, self._sent_endpoint(request_id)))
