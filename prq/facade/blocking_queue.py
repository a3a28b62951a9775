"""Queue: the blocking twin of AsyncQueue, driving the same flows with blocking calls.

Same methods, same semantics; pub/sub is read by one daemon thread per queue. Safe to share one
Queue between threads.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, TypeVar

from pydantic import JsonValue

from prq.core.config import QueueSettings, RedisSettings
from prq.core.errors import DataLoss, PrqError, QueueShutdown
from prq.core.models import (
    Delivery,
    PendingRequest,
    Request,
    RequestStatus,
    Response,
    validate_endpoint,
)
from prq.facade.send import BlockingSendHandle, OnFailure, OnResponse, SendState
from prq.node.base import SHUTDOWN_POLL_S, QueueBase
from prq.node.watch import NodeWatch
from prq.observe import metrics, tracing
from prq.protocol.dead import (
    DeadLetter,
    ReplayOutcome,
    dead_letters_flow,
    purge_dead_letters_flow,
    replay_dead_letter_flow,
)
from prq.protocol.effects import Exec, Flow, Handler, Offload, Reply
from prq.protocol.flows.call import call_flow
from prq.protocol.flows.cancel import cancel_flow
from prq.protocol.flows.status import status_flow
from prq.protocol.forget import ForgetOutcome, forget_endpoint_flow
from prq.protocol.limits import EndpointLimits, limits_flow, set_limits_flow
from prq.protocol.scripts.loading import script_load_calls
from prq.serve.sigterm import stop_on_sigterm
from prq.transport.links import shard_layout, sync_pubsub_connector
from prq.transport.pulses import PulseRouter, ThreadPulses, ThreadSignal
from prq.transport.shard_pulses import ThreadShardPulses
from prq.transport.sync_io import SyncRedisIO

if TYPE_CHECKING:
    from types import TracebackType

    from prq.datastreams import DataStreamStore

logger = logging.getLogger(__name__)

__all__ = ["Queue"]

T = TypeVar("T")


class Queue(QueueBase):
    """The pending-request queue for blocking code (the README shows its API)."""

    _io: SyncRedisIO
    _pulses: ThreadPulses | ThreadShardPulses
    _router: PulseRouter[ThreadSignal]

    def __init__(
        self,
        redis_settings: RedisSettings,
        *,
        prefix: str = "prq",
        settings: QueueSettings | None = None,
        datastreams: DataStreamStore | None = None,
        node_id: str | None = None,
    ) -> None:
        super().__init__(
            redis_settings,
            prefix=prefix,
            settings=settings,
            datastreams=datastreams,
            node_id=node_id,
        )
        self._io = SyncRedisIO(self.redis_settings, self.settings)
        self._router = PulseRouter(self.keys.node_channel(self.node_id), ThreadSignal)
        self._pulses = (
            ThreadShardPulses(self._io.client, self._router)
            if self.keys.sharded
            else ThreadPulses(sync_pubsub_connector(self._io.client), self._router)
        )
        self._watch = NodeWatch(self.ctx, self._router, partial(shard_layout, self._io.client))
        self._watch_wake = threading.Event()
        self._watch.wake = self._watch_wake.set
        self._watch_thread: threading.Thread | None = None
        self._started = False
        self._start_lock = threading.Lock()
        self._close_lock = threading.Lock()

    # -- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> Queue:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        """Load the scripts and start the pub/sub reader (done on first use if not called)."""
        with self._start_lock:
            if self._started:
                return
            if self._closed:
                raise self._shutdown_error()
            loaded, info = self._io.execute_many([script_load_calls(), *self._server_check_steps()])
            if isinstance(loaded, PrqError):
                raise loaded
            self._server_checked(info)
            self._pulses.start()
            self._watch_thread = threading.Thread(
                target=self._watch_loop, name="prq-watch", daemon=True
            )
            self._watch_thread.start()
            self._started = True
            logger.info("queue started node_id=%s prefix=%s", self.node_id, self.keys.prefix)

    def close(self, *, shutdown_timeout_s: float | None = None) -> None:
        """Shut down: callers still waiting fail with QueueShutdown, and `serve` takes nothing
        new. Requests its `serve` handlers work on get up to `shutdown_timeout_s` to be
        answered (heartbeats go on meanwhile); what is left, and what was dequeued by hand and
        not answered, is given back (at_least_once: queued again for another receiver;
        at_most_once: cancelled, its caller told). Then background work stops.
        `shutdown_timeout_s` overrides the setting (0: give everything back at once)."""
        with self._close_lock:
            if self._closing or self._closed:
                return
            self._closing = True
        self._router.wake_all()
        if self._started:
            timeout = self.settings.shutdown_timeout_s
            deadline = time.monotonic() + (
                timeout if shutdown_timeout_s is None else shutdown_timeout_s
            )
            while self._serving_held() and time.monotonic() < deadline:
                time.sleep(SHUTDOWN_POLL_S)  # bounded by the shutdown timeout
            try:
                self._run(self._hand_back_flow(), closing_ok=True)
            except PrqError as exc:
                logger.warning("could not give back held requests on shutdown error=%s", exc)
        self._closed = True
        self._router.wake_all()
        self._watch_wake.set()
        if self._watch_thread is not None:
            self._watch_thread.join(timeout=10)
        self._pulses.close()
        self._io.close()
        logger.info("queue closed node_id=%s", self.node_id)

    def _run(
        self, flow: Flow[T], epoch: tuple[str, int] | None = None, *, closing_ok: bool = False
    ) -> T:
        """Drive a flow: send its calls, wait on its signals, return its result.

        A prq error from Redis is thrown into the flow, so the flow can say what it means at
        that point (e.g. that an enqueued request may run although Redis went away). With an
        `epoch`, the call fails with DataLoss as soon as the node declares data loss.
        """
        reply: object = None
        error: PrqError | None = None
        sent = False
        while True:
            try:
                effect = flow.throw(error) if error is not None else flow.send(reply)
            except StopIteration as stop:
                result: T = stop.value
                return result
            except DataLoss:
                self._check_data_loss_now()
                raise
            error = None
            if self._closed or (self._closing and not closing_ok):
                flow.close()
                raise self._shutdown_error(sent)
            try:
                self._check_epoch(epoch)
            except DataLoss:
                flow.close()
                raise
            try:
                if isinstance(effect, Exec):
                    sent = True
                    reply = self._io.execute(effect.calls, express=effect.express)
                elif isinstance(effect, Offload):
                    reply = effect.work()
                else:
                    signal = effect.signal
                    assert isinstance(signal, ThreadSignal)
                    signal.wait(effect.seen, effect.timeout_s)
                    reply = None
            except QueueShutdown:  # closed while the calls were on their way
                error = self._shutdown_error(sent=True)
            except PrqError as exc:
                error = exc

    def _check_data_loss_now(self) -> None:
        """A call found its request gone: check now, so that a retry starts in the new epoch."""
        plan = self._watch.plan(time.monotonic(), check_only=True)
        try:
            self._watch.settle(plan, self._io.execute_many(plan.steps), time.monotonic())
        except PrqError as exc:
            logger.debug("data-loss check failed error=%s", exc)
            self._watch.forget(plan)

    def _watch_loop(self) -> None:
        """Beat, look for cancellations, check for data loss, renew the signatures and extend
        the stored data of held requests; never dies on an error."""
        while not self._closed:
            plan = self._watch.plan(time.monotonic())
            if plan.steps:
                try:
                    results = self._io.execute_many(plan.steps)
                except PrqError as exc:
                    logger.debug("watch turn failed error=%s", exc)
                    self._watch.forget(plan)
                else:
                    self._watch.settle(plan, results, time.monotonic())
            if self._streams.sweep_due(time.monotonic()):
                self._streams.sweep()
            if self._renewal_due(time.monotonic()):
                try:
                    self._run(self._renew_flow(), closing_ok=True)
                except PrqError as exc:
                    logger.debug("signature renewal failed error=%s", exc)
            self._watch_wake.wait(self._watch.wait_s(time.monotonic()))
            self._watch_wake.clear()

    def _ready(self, *, closing_ok: bool = False) -> None:
        if not self._started:
            self.start()
        if self._closed or (self._closing and not closing_ok):
            raise self._shutdown_error()

    # -- sender -------------------------------------------------------------------------------

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
                    partial(
                        self._enqueued,
                        request.endpoint,
                        self._watch.data_loss.epoch,
                        then=on_enqueued,
                    ),
                    partial(self._redelivered, request.endpoint),
                    register=self._first_use(request.endpoint),
                    layout=self._check_layout_flow(request.endpoint),
                )
                response = self._run(flow, self._watch.epoch_of(request.endpoint))
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

    def dead_letters(self, endpoint: str, *, offset: int = 0, limit: int = 100) -> list[DeadLetter]:
        """The endpoint's dead letters, newest first (see prq.protocol.dead)."""
        self._ready()
        return self._run(dead_letters_flow(self.ctx, endpoint, offset=offset, limit=limit))

    def replay_dead_letter(self, endpoint: str, request_id: str) -> ReplayOutcome:
        """Queue a dead letter again under its id, once: "replayed", "live" (the id is queued or
        in flight already) or "missing" (no such dead letter, e.g. replayed before)."""
        self._ready()
        return self._run(replay_dead_letter_flow(self.ctx, endpoint, request_id))

    def purge_dead_letters(self, endpoint: str, request_ids: list[str] | None = None) -> int:
        """Drop the named dead letters (None: all of the endpoint's); how many were dropped."""
        self._ready()
        return self._run(purge_dead_letters_flow(self.ctx, endpoint, request_ids))

    def forget_endpoint(self, endpoint: str, *, force: bool = False) -> ForgetOutcome:
        """Remove the endpoint from the registry (the admin views' list), unless it holds work
        or has a live receiver (`force`: anyway); never removes a request. See
        prq.protocol.forget."""
        self._ready()
        return self._run(forget_endpoint_flow(self.ctx, endpoint, force=force))

    def limits(self, endpoint: str) -> EndpointLimits:
        """The endpoint's capacity limits (max_in_flight, max_pending), as every node sees them."""
        self._ready()
        return self._run(limits_flow(self.ctx, endpoint))

    def set_limits(
        self,
        endpoint: str,
        *,
        max_in_flight: int | None = None,
        max_pending: int | None = None,
    ) -> EndpointLimits:
        """Replace the endpoint's capacity limits (None: no limit); see prq.protocol.limits."""
        self._ready()
        flow = set_limits_flow(
            self.ctx, endpoint, max_in_flight=max_in_flight, max_pending=max_pending
        )
        return self._run(flow)

    def status(self, request_id: str) -> RequestStatus:
        """Where a request stands (any node can ask)."""
        self._ready()
        return self._run(status_flow(self.ctx, request_id, self._sent_endpoint(request_id)))

    # -- receiver -----------------------------------------------------------------------------

    def dequeue(self, endpoint: str, *, timeout_s: float | None = None) -> PendingRequest | None:
        """Take the next request of `endpoint`, waiting up to the long-poll; None if idle."""
        taken = self.dequeue_many(endpoint, 1, timeout_s=timeout_s)
        return taken[0] if taken else None

    def dequeue_many(
        self,
        endpoint: str,
        max_items: int,
        *,
        timeout_s: float | None = None,
    ) -> list[PendingRequest]:
        """Take up to `max_items` requests of `endpoint` in one step (waits for the first)."""
        timeout = self.settings.dequeue_timeout_s if timeout_s is None else timeout_s
        return self._take(endpoint, max_items, timeout)

    def _listen(self, endpoint: str) -> None:
        """On a cluster: subscribe (once) to this node's channel of `endpoint` (see
        AsyncQueue._listen)."""
        if self.keys.sharded:
            channel = self.keys.endpoint(endpoint).node_channel(self.node_id)
            self._pulses.ensure_subscribed(channel)

    def _take(
        self,
        endpoint: str,
        max_items: int,
        timeout_s: float,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[PendingRequest]:
        validate_endpoint(endpoint)
        self._ready()
        self._listen(endpoint)
        channel = self.keys.endpoint(endpoint).pulse_channel
        self._pulses.ensure_subscribed(channel)
        current: list[str] = []
        try:
            return self._run(
                self._receive_flow(endpoint, channel, max_items, timeout_s, should_stop, current)
            )
        except BaseException as exc:
            if current and not isinstance(exc, PrqError):
                # cut short (KeyboardInterrupt, SystemExit): give back what the take was handed
                with contextlib.suppress(Exception):
                    self._run(self._unpark_flow(current), closing_ok=True)
            raise

    def apply_response(self, response: Response) -> None:
        """Answer a request this node dequeued; the first response wins (also while the queue
        closes, until the shutdown timeout).

        An answer that cannot be sent (over max_body_bytes, not JSON, DataStreams that cannot
        be stored) still ends the call: the caller is answered with an error saying why
        (type "ResponseTooLarge", "SerializationError", ...) and the reason is raised here
        (PayloadTooLarge, ...). An answer Redis does not take within the retry budget raises
        QueueUnavailable, and the request is let go: nothing beats for it any more, so its
        caller's receiver check decides."""
        body, error = self._answer_body(response)
        if body is not None:
            failed = self._write_answers([(response.id, body)])
            if failed:
                raise failed[response.id]
        if error is not None:
            raise error

    def _answer_body(self, response: Response) -> tuple[bytes | None, PrqError | None]:
        """apply_response's first half: the body that answers a held request
        (None when this node does not hold it), and the error to report when the service's
        answer could not be sent and the body says so instead. The body goes out through
        `_write_answers`."""
        self._ready(closing_ok=True)
        if not self._holds(response.id):
            return None, None
        try:
            return self._encoded_answer(response), None
        except Exception as exc:
            error, body = self._answer_instead(response.id, exc)
            return body, error

    def _write_answers(self, answers: Sequence[tuple[str, bytes]]) -> dict[str, PrqError]:
        """apply_response's second half, for one held request or many: their answers in one
        round trip (answers to one endpoint go as one script call, merge_answers), each
        booked (_after_respond); one more round trip for answers that go again under a new
        owner token (_answer_flow). An answer that cannot be written lets its request go
        (_unanswered); returns those answers' errors, by request id."""
        answering = self._start_answers(answers)
        failed: dict[str, PrqError] = {}
        while answering:  # (an answer goes again only under a new owner token: _answer_flow)
            if self._closed:
                results: list[list[Reply] | PrqError] = [self._shutdown_error(False)] * len(
                    answering
                )
            else:
                results = self._io.execute_many([answer.effect.calls for answer in answering])
            answering, clean_ups = self._settle_answers(answering, results, failed)
            for clean_up in clean_ups:
                clean_up()
        return failed

    def _encoded_answer(self, response: Response) -> bytes:
        """The body that answers a held request: its streams stored, its size checked, kept
        beside Redis over inline_limit_bytes."""
        ttl_s = self._answer_ttl_s(response.id)
        response = self._streams.store_response(response, ttl_s)
        body = self._encode_response(response)
        if self._streams.spills(body):
            body = self._streams.spill_response(response, body, ttl_s)
        return body

    def serve(
        self,
        endpoint: str,
        handler: Handler,
        *,
        concurrency: int = 1,
        stop: threading.Event | None = None,
    ) -> None:
        """Run `handler` for every request of `endpoint` until `stop` is set or the queue closes.

        Without a `stop`, in the main thread, SIGTERM stops it gracefully (prq.serve.sigterm)."""
        from prq.serve.worker import serve_sync

        if stop is not None:
            serve_sync(self, endpoint, handler, concurrency=concurrency, stop=stop)
            return
        stop = threading.Event()
        with stop_on_sigterm(stop):
            serve_sync(self, endpoint, handler, concurrency=concurrency, stop=stop)
