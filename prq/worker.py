"""serve(): the server loop around dequeue, the handler, and apply_response.

The loop takes as many requests as it has free slots (one take for several), runs each in the
handler (a coroutine function on the loop, a plain function in a worker thread, so the loop and
its heartbeats never wait on the handler's CPU), and answers. A handler exception becomes
`Response.error`; an answer that cannot be sent (too large, not JSON) ends the call with an
error saying why (see `apply_response`). A failing Redis never kills the loop: it backs off
with jitter and goes on. On stop it takes nothing new and finishes what it holds; when the
queue closes, the handlers still running get the queue's shutdown timeout to answer (see
`AsyncQueue.aclose`).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import inspect
import logging
import random
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, cast

from pydantic import JsonValue, ValidationError

from prq._types import Handler
from prq.errors import PrqError, QueueShutdown
from prq.models import PendingRequest, Request, Response, ServerError, validate_endpoint

if TYPE_CHECKING:
    from prq.queue import AsyncQueue
    from prq.sync import Queue

logger = logging.getLogger(__name__)

__all__ = ["build_response", "current_request", "serve_async", "serve_sync"]

#: Largest pause after a failed dequeue before the loop tries again.
DEFAULT_ERROR_BACKOFF_MAX_S = 5.0
#: How often a main thread waiting for its serve threads wakes (so that signals are handled).
JOIN_WAKE_S = 0.2

_current: contextvars.ContextVar[PendingRequest | None] = contextvars.ContextVar(
    "prq_current_request", default=None
)


def current_request() -> PendingRequest | None:
    """The PendingRequest being handled (inside a `serve` handler); None elsewhere."""
    return _current.get()


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


def _is_async(handler: Handler) -> bool:
    call = type(handler).__call__ if not inspect.isfunction(handler) else None
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


def _backoff_s(failures: int) -> float:
    jitter = random.random()  # noqa: S311 (backoff jitter, not a secret)
    return float(min(DEFAULT_ERROR_BACKOFF_MAX_S, 0.1 * 2 ** min(failures, 8)) * jitter)


def _run_sync_handler(handler: Handler, pending: PendingRequest) -> object:
    token = _current.set(pending)
    try:
        result = handler(pending.request)
        if inspect.isawaitable(result):
            return asyncio.run(_await(result))
        return result
    finally:
        _current.reset(token)


async def _await(awaitable: Awaitable[object]) -> object:
    return await awaitable


# -- asyncio ------------------------------------------------------------------------------------


async def serve_async(
    queue: AsyncQueue,
    endpoint: str,
    handler: Handler,
    *,
    concurrency: int = 1,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve `endpoint` with `handler` until `stop` is set or the queue closes."""
    validate_endpoint(endpoint)
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    run = _async_runner(handler, concurrency)
    running: set[asyncio.Task[None]] = set()

    def stopped() -> bool:
        return (stop is not None and stop.is_set()) or queue.closed

    async def handle(pending: PendingRequest) -> None:
        queue._serving.add(pending.id)
        try:
            try:
                response = build_response(pending.id, await run(pending))
            except Exception as exc:
                response = build_response(pending.id, exc=exc)
            try:
                await queue.apply_response(response)
            except PrqError as exc:
                logger.error("could not answer request_id=%s error=%s", pending.id, exc)
        finally:
            queue._serving.discard(pending.id)

    failures = 0
    logger.info("serving endpoint=%r concurrency=%d", endpoint, concurrency)
    try:
        while not stopped():
            free = concurrency - len(running)
            if free <= 0:
                await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                continue
            try:
                taken = await queue._take(endpoint, free, queue.settings.dequeue_timeout_s, stopped)
                failures = 0
            except QueueShutdown:
                break
            except PrqError as exc:
                failures = _log_failure(endpoint, exc, failures)
                await asyncio.sleep(_backoff_s(failures))
                continue
            for pending in taken:
                task = asyncio.create_task(handle(pending))
                running.add(task)
                task.add_done_callback(running.discard)
            # Let the new handlers start before the next take: a quick handler's response
            # then goes out first, instead of queueing behind the take that parks this loop.
            await asyncio.sleep(0)
    finally:
        if running:
            await asyncio.wait(running)
        logger.info("stopped serving endpoint=%r", endpoint)


def _async_runner(
    handler: Handler, concurrency: int
) -> Callable[[PendingRequest], Awaitable[object]]:
    """Run a coroutine handler on the loop, a plain one in a worker thread."""
    if _is_async(handler):
        async_handler = cast(Callable[[Request], Awaitable[object]], handler)

        async def run_on_loop(pending: PendingRequest) -> object:
            token = _current.set(pending)
            try:
                return await async_handler(pending.request)
            finally:
                _current.reset(token)

        return run_on_loop

    executor = ThreadPoolExecutor(concurrency, thread_name_prefix="prq-handler")

    async def run_in_thread(pending: PendingRequest) -> object:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, _run_sync_handler, handler, pending)

    return run_in_thread


def _log_failure(endpoint: str, exc: PrqError, failures: int) -> int:
    failures += 1
    level = logging.WARNING if failures == 1 else logging.DEBUG
    logger.log(level, "dequeue failed endpoint=%r error=%s failures=%d", endpoint, exc, failures)
    return failures


# -- threads ------------------------------------------------------------------------------------


def serve_sync(
    queue: Queue,
    endpoint: str,
    handler: Handler,
    *,
    concurrency: int = 1,
    stop: threading.Event | None = None,
) -> None:
    """Serve `endpoint` with `handler` until `stop` is set or the queue closes.

    Each of the `concurrency` workers runs requests in its own thread (the calling thread when
    `concurrency` is 1). One of the idle workers at a time takes from Redis, for itself and for
    every other idle worker: it runs the first request it gets itself (a request passes no
    thread hand-off between its pulse and its handler) and leaves the rest to the others, so
    one take serves many workers when work is waiting. Answers go the same way (_AnswerTurns):
    the worker that finds no answer being written writes its own at once, with those the
    others leave meanwhile, while they go on to their next request. On stop no worker takes
    again, and what was taken is run and answered before this returns.
    """
    validate_endpoint(endpoint)
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    pause = stop or threading.Event()

    def stopped() -> bool:
        return pause.is_set() or queue.closed

    turns = _TakeTurns(queue, endpoint, stopped, pause)
    answers = _AnswerTurns(queue)

    def work() -> None:
        while True:
            pending, going = turns.next_request()
            if pending is not None:
                _answer(queue, handler, pending, answers)
            elif not going:
                return

    logger.info("serving endpoint=%r concurrency=%d", endpoint, concurrency)
    if concurrency == 1:
        work()
    else:
        workers = [
            threading.Thread(target=work, name=f"prq-serve-{n}", daemon=True)
            for n in range(concurrency)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            # In short joins: a signal the kernel delivers to another thread only reaches its
            # Python handler (SIGTERM's stop, prq.sigterm) when the main thread next wakes.
            while worker.is_alive():
                worker.join(JOIN_WAKE_S)
    logger.info("stopped serving endpoint=%r", endpoint)


class _TakeTurns:
    """The workers of one `serve_sync`: one idle worker at a time takes from Redis, for itself
    and for every worker waiting meanwhile; what it takes beyond its own first request waits
    in a backlog for the others (held, so beaten for, and counted as serving at once)."""

    def __init__(
        self, queue: Queue, endpoint: str, stopped: Callable[[], bool], pause: threading.Event
    ) -> None:
        self.queue = queue
        self.endpoint = endpoint
        self.stopped = stopped
        self.pause = pause
        self.turns = threading.Condition()
        self.backlog: collections.deque[PendingRequest] = collections.deque()
        self.taking = False  # a worker is taking from Redis
        self.waiting = 0  # workers waiting for a request while another one takes
        self.failures = 0

    def next_request(self) -> tuple[PendingRequest | None, bool]:
        """The next request for the calling worker (None: none this turn), taken for it and
        the waiting others if none waits; and whether the worker should go on."""
        with self.turns:
            while not self.backlog and self.taking and not self.stopped():
                self.waiting += 1
                self.turns.wait(JOIN_WAKE_S)
                self.waiting -= 1
            if self.backlog:
                return self.backlog.popleft(), True
            if self.stopped():
                return None, False
            self.taking = True
            want = self.waiting + 1
        taken: list[PendingRequest] = []
        try:
            taken = self.queue._take(
                self.endpoint, want, self.queue.settings.dequeue_timeout_s, self.stopped
            )
            self.failures = 0
        except QueueShutdown:
            return None, False
        except PrqError as exc:
            self.failures = _log_failure(self.endpoint, exc, self.failures)
            self.pause.wait(_backoff_s(self.failures))
        finally:
            with self.turns:
                self.taking = False
                for pending in taken:  # running from now on, for the queue's closing
                    self.queue._serving.add(pending.id)
                self.backlog.extend(taken[1:])
                # one waiting worker per request left over, and one to take next (this one
                # runs the first); not all of them: a wake-up costs each one CPU
                self.turns.notify(len(taken))
        return (taken[0] if taken else None), True


class _AnswerTurns:
    """The answers of one `serve_sync`'s workers. A worker whose answer finds no answer being
    written writes it at once, with every answer the others leave meanwhile; one whose answer
    finds a write in flight leaves it to that writer and goes on to its next request. So a lone
    answer goes out at once, and under load one round trip carries many answers without a
    thread waiting on each (a request stays held, beaten for and counted as serving, until its
    answer is written)."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.lock = threading.Lock()
        self.queued: list[tuple[str, bytes]] = []
        self.writing = False

    def answer(self, request_id: str, body: bytes) -> None:
        with self.lock:
            self.queued.append((request_id, body))
            if self.writing:
                return
            self.writing = True
        batch: list[tuple[str, bytes]] = []
        try:
            while True:
                with self.lock:
                    batch, self.queued = self.queued, []
                    if not batch:
                        self.writing = False
                        return
                for written, error in self.queue._write_answers(batch).items():
                    logger.error("could not answer request_id=%s error=%s", written, error)
                for written, _ in batch:
                    self.queue._serving.discard(written)
        except BaseException:
            with self.lock:  # the next worker that answers writes what is left
                self.writing = False
            for written, _ in batch:
                self.queue._serving.discard(written)
            raise


def _answer(queue: Queue, handler: Handler, pending: PendingRequest, answers: _AnswerTurns) -> None:
    queue._serving.add(pending.id)
    body: bytes | None = None
    try:
        try:
            response = build_response(pending.id, _run_sync_handler(handler, pending))
        except Exception as exc:
            response = build_response(pending.id, exc=exc)
        try:
            body, error = queue._answer_body(response)
        except PrqError as exc:
            error = exc
        if error is not None:
            logger.error("could not answer request_id=%s error=%s", pending.id, error)
        if body is not None:
            answers.answer(pending.id, body)  # it leaves `_serving` once written
    finally:
        if body is None:
            queue._serving.discard(pending.id)
