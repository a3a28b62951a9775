"""AsyncQueue: the pending-request queue on asyncio (the core), and what both facades share.

A queue object is one node: it has a node id, one connection pool, and one pub/sub connection
for all its subscriptions. Lifecycle: created → started (scripts loaded, pub/sub reader up; on
first use or `async with`) → closed (waiting callers fail with QueueShutdown).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from pydantic import JsonValue, ValidationError

from prq._types import Exec, Flow, Handler
from prq.config import QueueSettings, RedisSettings
from prq.errors import ConfigurationError, PayloadTooLarge, QueueShutdown, RemoteError, SerializationError
from prq.dedup import delivery_hash
from prq.flows import (
    Context,
    call_flow,
    locate_flow,
    respond_flow,
    status_flow,
    take_flow,
    withdraw_flow,
)
from prq.keys import KeySchema
from prq.models import (
    DeliveryInfo,
    PendingRequest,
    Request,
    RequestState,
    RequestStatus,
    Response,
    ServerError,
    decode_request,
    validate_endpoint,
)
from prq.pulses import AsyncPulses, AsyncSignal, PulseRouter
from prq.redis_io import AsyncRedisIO
from prq.scripts import TakenItem, script_load_calls

if TYPE_CHECKING:
    from types import TracebackType

    from prq.datastreams import DataStreamStore

logger = logging.getLogger(__name__)

__all__ = ["AsyncQueue", "QueueStats"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Client-side counters of one node (for tests, benchmarks and metrics)."""

    redis_commands: int
    round_trips: int
    redis_retries: int
    subscriptions: int
    pubsub_reconnects: int
    pulses_received: int
    held_requests: int


class QueueBase:
    """What both facades share: settings, keys, node identity, and pure request handling."""

    def __init__(
        self,
        redis_settings: RedisSettings,
        *,
        prefix: str = "prq",
        settings: QueueSettings | None = None,
        datastreams: DataStreamStore | None = None,
        node_id: str | None = None,
    ) -> None:
        self.redis_settings = redis_settings
        self.settings = settings or QueueSettings()
        self.keys = KeySchema(prefix)
        self.node_id = node_id or uuid.uuid4().hex[:16]
        self.datastreams = datastreams
        self.ctx = Context(self.keys, self.settings, self.node_id)
        #: Requests this node took and has not answered: id → PendingRequest (owner token).
        self._held: dict[str, PendingRequest] = {}
        #: Requests this node sent and still waits for: id → endpoint.
        self._sent: dict[str, str] = {}
        self._closed = False
        if datastreams is not None:
            raise ConfigurationError(
                "a DataStreamStore was given, but large payloads beside Redis are not supported "
                "by this version; bodies up to max_body_bytes are kept inline"
            )

    # -- building and checking what goes to Redis -------------------------------------------

    def build_request(
        self,
        endpoint: str,
        method: str,
        params: JsonValue = None,
        *,
        service: str = "",
        priority: int = 0,
        producer: str | None = None,
        request_id: str | None = None,
    ) -> Request:
        fields: dict[str, object] = {
            "endpoint": endpoint,
            "method": method,
            "params": params,
            "service": service,
            "priority": priority,
            "producer": producer or self.node_id,
        }
        if request_id is not None:
            fields["id"] = request_id
        return Request(**fields)

    def _encode_request(self, request: Request) -> tuple[Request, bytes]:
        validate_endpoint(request.endpoint)
        if request.producer is None:
            request = request.model_copy(update={"producer": self.node_id})
        body = request.model_dump_json().encode()
        self._check_size(body, "request", request.id)
        return request, body

    def _encode_response(self, response: Response) -> bytes:
        body = response.model_dump_json().encode()
        self._check_size(body, "response", response.id)
        return body

    def _check_size(self, body: bytes, what: str, request_id: str) -> None:
        limit = self.settings.max_body_bytes
        if len(body) > limit:
            raise PayloadTooLarge(
                f"{what} {request_id} is {len(body)} bytes, over max_body_bytes={limit}; "
                "nothing was written",
                size_bytes=len(body),
                limit_bytes=limit,
            )

    def _pickup_timeout(self, pickup_timeout_s: float | None) -> float:
        return self.settings.pickup_timeout_s if pickup_timeout_s is None else pickup_timeout_s

    def _adopt(
        self, endpoint: str, token: str, items: list[TakenItem]
    ) -> tuple[list[PendingRequest], list[tuple[TakenItem, SerializationError]]]:
        """Turn taken items into PendingRequests; return undecodable ones separately."""
        good: list[PendingRequest] = []
        bad: list[tuple[TakenItem, SerializationError]] = []
        for item in items:
            try:
                request = decode_request(item.body)
                if request.id != item.request_id or request.endpoint != endpoint:
                    raise SerializationError(
                        f"stored request {item.request_id} names another id or endpoint"
                    )
            except SerializationError as exc:
                logger.warning(
                    "undecodable request skipped endpoint=%r request_id=%s error=%s",
                    endpoint,
                    item.request_id,
                    exc,
                )
                bad.append((item, exc))
                continue
            delivery = DeliveryInfo(
                attempt=item.attempt, delivery_hash=delivery_hash(endpoint, request.id)
            )
            pending = PendingRequest(request, delivery, token)
            self._held[request.id] = pending
            good.append(pending)
        return good, bad

    def _respond_flow(self, response: Response) -> Flow[str] | None:
        """The flow that answers a held request, or None if this node does not hold it."""
        pending = self._held.get(response.id)
        if pending is None:
            logger.warning("response for a request this node does not hold request_id=%s",
                           response.id)
            return None
        body = self._encode_response(response)
        return respond_flow(
            self.ctx, pending.request.endpoint, response.id, pending.owner_token, body
        )

    def _after_respond(self, request_id: str, outcome: str) -> None:
        self._held.pop(request_id, None)
        if outcome not in ("ok", "replay"):
            logger.warning("response dropped request_id=%s outcome=%s", request_id, outcome)

    @staticmethod
    def _bad_item_response(item: TakenItem, exc: SerializationError) -> bytes:
        error = ServerError(type="SerializationError", message=str(exc)[:500])
        return Response(id=item.request_id, error=error).model_dump_json().encode()

    @staticmethod
    def _result(request: Request, response: Response) -> JsonValue:
        if response.error is not None:
            raise RemoteError(response.error, request_id=request.id, endpoint=request.endpoint)
        return response.result

    def _shutdown_error(self) -> QueueShutdown:
        return QueueShutdown("the queue was closed while the call was waiting; retry elsewhere")


class AsyncQueue(QueueBase):
    """The pending-request queue for asyncio code (see DESIGN.md §2)."""

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
            redis_settings, prefix=prefix, settings=settings, datastreams=datastreams,
            node_id=node_id,
        )
        self._io = AsyncRedisIO(self.redis_settings, self.settings)
        self._router: PulseRouter[AsyncSignal] = PulseRouter(
            self.keys.node_channel(self.node_id), AsyncSignal
        )
        self._pulses = AsyncPulses(self._io.client, self._router)
        self._started = False
        self._start_lock = asyncio.Lock()
        self._background: set[asyncio.Future[None]] = set()

    @classmethod
    def from_url(
        cls,
        url: str | None = None,
        *,
        prefix: str = "prq",
        settings: QueueSettings | None = None,
        datastreams: DataStreamStore | None = None,
        redis_settings: RedisSettings | None = None,
    ) -> AsyncQueue:
        """A queue on the Redis at `url` (None reads PRQ_REDIS_URL)."""
        if redis_settings is None:
            redis_settings = RedisSettings.from_url(url)
        return cls(redis_settings, prefix=prefix, settings=settings, datastreams=datastreams)

    # -- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> AsyncQueue:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Load the scripts and start the pub/sub reader (done on first use if not called)."""
        if self._started:
            return
        async with self._start_lock:
            if self._started:
                return
            if self._closed:
                raise self._shutdown_error()
            await self._io.execute(script_load_calls())
            await self._pulses.start()
            self._started = True
            logger.info("queue started node_id=%s prefix=%s", self.node_id, self.keys.prefix)

    async def aclose(self) -> None:
        """Stop background work; callers still waiting fail with QueueShutdown."""
        if self._closed:
            return
        self._closed = True
        self._router.wake_all()
        await asyncio.sleep(0)  # let woken waiters observe the shutdown
        await self._pulses.aclose()
        await self._io.aclose()
        logger.info("queue closed node_id=%s", self.node_id)

    @property
    def stats(self) -> QueueStats:
        return QueueStats(
            redis_commands=self._io.commands,
            round_trips=self._io.round_trips,
            redis_retries=self._io.retries,
            subscriptions=self._pulses.subscriptions,
            pubsub_reconnects=self._pulses.reconnects,
            pulses_received=self._router.messages,
            held_requests=len(self._held),
        )

    async def _run(self, flow: Flow[T]) -> T:
        """Drive a flow: send its calls, wait on its signals, return its result."""
        reply: object = None
        while True:
            try:
                effect = flow.send(reply)
            except StopIteration as stop:
                result: T = stop.value
                return result
            if self._closed:
                flow.close()
                raise self._shutdown_error()
            if isinstance(effect, Exec):
                reply = await self._io.execute(effect.calls)
            else:
                signal = effect.signal
                assert isinstance(signal, AsyncSignal)
                await signal.wait(effect.seen, effect.timeout_s)
                reply = None

    async def _ready(self) -> None:
        if not self._started:
            await self.start()
        if self._closed:
            raise self._shutdown_error()

    # -- sender -------------------------------------------------------------------------------

    async def queue_and_wait(
        self,
        request: Request,
        *,
        pickup_timeout_s: float | None = None,
        timeout_s: float | None = None,
    ) -> Response:
        """Enqueue `request` and wait for its response (an error response is returned)."""
        request, body = self._encode_request(request)
        await self._ready()
        self._sent[request.id] = request.endpoint
        try:
            with self._router.watch_response(request.id) as signal:
                flow = call_flow(
                    self.ctx, request, body, signal, self._pickup_timeout(pickup_timeout_s),
                    timeout_s,
                )
                return await self._run(flow)
        except asyncio.CancelledError:
            self._withdraw_in_background(request)
            raise
        finally:
            self._sent.pop(request.id, None)

    def _withdraw_in_background(self, request: Request) -> None:
        """The caller gave up: take the request back if no receiver has it yet."""
        if self._closed:
            return

        async def withdraw() -> None:
            try:
                await self._run(withdraw_flow(self.ctx, request, "cancelled"))
            except Exception as exc:
                logger.debug("withdraw after caller cancel failed request_id=%s error=%s",
                             request.id, exc)

        task = asyncio.ensure_future(withdraw())
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
            endpoint, method, params, service=service, priority=priority, producer=producer,
            request_id=request_id,
        )
        response = await self.queue_and_wait(
            request, pickup_timeout_s=pickup_timeout_s, timeout_s=timeout_s
        )
        return self._result(request, response)

    async def cancel(self, request_id: str) -> bool:
        """Withdraw a request not yet picked up; True if this call withdrew it."""
        await self._ready()
        endpoint = self._sent.get(request_id)
        if endpoint is None:
            endpoint = await self._run(locate_flow(self.ctx, request_id))
            if endpoint is None:
                return False
        request = Request(endpoint=endpoint, method="-", id=request_id)
        snapshot = await self._run(withdraw_flow(self.ctx, request, "cancelled"))
        return snapshot.state == RequestState.WITHDRAWN and snapshot.reason == "cancelled"

    async def status(self, request_id: str) -> RequestStatus:
        """Where a request stands (any node can ask)."""
        await self._ready()
        return await self._run(status_flow(self.ctx, request_id, self._sent.get(request_id)))

    # -- receiver -----------------------------------------------------------------------------

    async def dequeue(
        self, endpoint: str, *, timeout_s: float | None = None
    ) -> PendingRequest | None:
        """Take the next request of `endpoint`, waiting up to the long-poll; None if idle."""
        taken = await self.dequeue_many(endpoint, 1, timeout_s=timeout_s)
        return taken[0] if taken else None

    async def dequeue_many(
        self,
        endpoint: str,
        max_items: int,
        *,
        timeout_s: float | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[PendingRequest]:
        """Take up to `max_items` requests of `endpoint` in one step (waits for the first)."""
        validate_endpoint(endpoint)
        await self._ready()
        keys = self.keys.endpoint(endpoint)
        await self._pulses.ensure_subscribed(keys.pulse_channel)
        signal = self._router.endpoint_signal(keys.pulse_channel)
        timeout = self.settings.dequeue_timeout_s if timeout_s is None else timeout_s
        while True:
            token, items = await self._run(
                take_flow(self.ctx, endpoint, signal, max_items, timeout, should_stop)
            )
            good, bad = self._adopt(endpoint, token, items)
            for item, exc in bad:
                await self._run(
                    respond_flow(self.ctx, endpoint, item.request_id, token,
                                 self._bad_item_response(item, exc))
                )
            if good or not items:
                return good

    async def apply_response(self, response: Response) -> None:
        """Answer a request this node dequeued; the first response wins."""
        await self._ready()
        flow = self._respond_flow(response)
        if flow is None:
            return
        outcome = await self._run(flow)
        self._after_respond(response.id, outcome)

    async def serve(
        self,
        endpoint: str,
        handler: Handler,
        *,
        concurrency: int = 1,
        stop: asyncio.Event | None = None,
    ) -> None:
        """Run `handler` for every request of `endpoint` until `stop` is set or the queue closes."""
        from prq.worker import serve_async

        await serve_async(self, endpoint, handler, concurrency=concurrency, stop=stop)
