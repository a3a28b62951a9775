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
import math
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, cast

from prq.core.errors import PrqError, QueueShutdown
from prq.core.jitter import jitter
from prq.core.lifecycle import PendingRequest
from prq.core.models import Request
from prq.core.names import validate_endpoint
from prq.observe import tracing
from prq.protocol.effects import Handler
from prq.serve.handled import build_response, handler_response
from prq.transport.async_io import MAX_ROUND_TRIPS_IN_FLIGHT

if TYPE_CHECKING:
    from prq.facade.asyncio_queue import AsyncQueue
    from prq.facade.blocking_queue import Queue

logger = logging.getLogger(__name__)

__all__ = ["build_response", "current_request", "serve_async", "serve_sync"]

#: Largest pause after a failed dequeue before the loop tries again.
DEFAULT_ERROR_BACKOFF_MAX_S = 5.0
#: Requests an asyncio serve loop may hold per handler slot, counting those whose answers are
#: being written (the slot itself is free once the handler returns), besides those it takes
#: ahead.
ANSWER_BACKLOG = 2
#: An asyncio serve loop takes ahead of its handlers only while their runs take less than this
#: on average (see _Pace), and weighs each new run so much in that average.
TAKE_AHEAD_BELOW_S = 0.005
PACE_WEIGHT = 0.1
#: Bound on the writers an asyncio serve loop's closing waits for in turn (each writes until
#: nothing is left, within its steps' retry budgets; a writer ends only when its write fails).
FLUSH_ROUNDS = 1000
#: How often a main thread waiting for its serve threads wakes (so that signals are handled),
#: and a serve thread waiting for a request looks whether one waits for it unannounced.
JOIN_WAKE_S = 0.2
#: A blocking serve loop wakes one worker thread per this much expected handler time of the
#: requests a take brought beyond the taker's own (see _TakeTurns): a thread hand-off costs
#: more CPU than a quick handler's whole run.
SHARE_S = 0.002
#: A blocking serve loop whose handlers are quick (TAKE_AHEAD_BELOW_S) takes ahead once the
#: requests left in its backlog hold no more than this much expected handler time (about a
#: take's round trip): the next take is on its way while the workers run what is left.
TAKE_AHEAD_LEFT_S = 0.002

_current: contextvars.ContextVar[PendingRequest | None] = contextvars.ContextVar(
    "prq_current_request", default=None
)


def current_request() -> PendingRequest | None:
    """The PendingRequest being handled (inside a `serve` handler); None elsewhere."""
    return _current.get()


def _is_async(handler: Handler) -> bool:
    call = type(handler).__call__ if not inspect.isfunction(handler) else None
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


def _backoff_s(failures: int) -> float:
    return float(min(DEFAULT_ERROR_BACKOFF_MAX_S, 0.1 * 2 ** min(failures, 8)) * jitter())


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
    """Serve `endpoint` with `handler` until `stop` is set or the queue closes.

    At most `concurrency` handlers run at once. A handler's slot is free as soon as it returns:
    its answer is written apart (batched with the others' by the node's link), the request
    held (beaten for, counted as serving) until it is. While the handlers are quick (_Pace)
    and work is waiting, the loop takes ahead: the next take goes out before the requests just
    taken are run, so Redis hands out the next batch while this process runs the last one
    (up to `concurrency` requests more are held, waiting for a slot)."""
    validate_endpoint(endpoint)
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    held = _AsyncHeld(queue, _async_runner(handler, concurrency), concurrency)

    def stopped() -> bool:
        return (stop is not None and stop.is_set()) or queue.closed

    failures = 0
    logger.info("serving endpoint=%r concurrency=%d", endpoint, concurrency)
    try:
        while not stopped():
            free = held.room()
            if free <= 0:
                await held.wait_for_room()
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
                held.start(pending)
            if not held.taking_ahead or len(taken) < free:
                # Let the new handlers start before the next take: a quick handler's response
                # then goes out first, instead of queueing behind the take that parks this
                # loop. (A full batch of quick ones: the next take goes first, see above.)
                await asyncio.sleep(0)
    finally:
        await held.finish()
        logger.info("stopped serving endpoint=%r", endpoint)


class _AsyncHeld:
    """The requests one asyncio serve loop holds: each in a task that waits for a handler
    slot, runs the handler, and answers or leaves its answer to a write in flight (the slot is
    free once the handler returns)."""

    def __init__(
        self,
        queue: AsyncQueue,
        run: Callable[[PendingRequest], Awaitable[object]],
        concurrency: int,
    ) -> None:
        self.queue = queue
        self.run = run
        self.concurrency = concurrency
        self.slots = asyncio.Semaphore(concurrency)
        self.pace = _Pace()
        self.tasks: set[asyncio.Task[None]] = set()
        self.unhandled = 0  # held requests whose handler has not returned yet
        self.handler_done = asyncio.Event()
        self.answers = _AsyncAnswers(queue)

    @property
    def taking_ahead(self) -> bool:
        return self.pace.quick

    def room(self) -> int:
        """How many requests the loop may take now: up to `concurrency` not yet handled (twice
        that when taking ahead), and no more than ANSWER_BACKLOG times `concurrency` held
        besides those taken ahead."""
        ahead = self.concurrency if self.pace.quick else 0
        return min(
            self.concurrency + ahead - self.unhandled,
            ANSWER_BACKLOG * self.concurrency + ahead - len(self.tasks) - self.answers.unwritten,
        )

    async def wait_for_room(self) -> None:
        if self.unhandled >= self.concurrency:
            self.handler_done.clear()
            await self.handler_done.wait()
            return
        self.answers.ensure_writing()
        written = asyncio.ensure_future(self.answers.next_written().wait())
        try:
            await asyncio.wait({*self.tasks, written}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            written.cancel()

    def start(self, pending: PendingRequest) -> None:
        self.unhandled += 1
        task = asyncio.create_task(self._handle(pending))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _handle(self, pending: PendingRequest) -> None:
        queue = self.queue
        queue._serving.add(pending.id)
        left = False
        try:
            with tracing.processing(pending, queue.node_id) as traced:
                try:
                    async with self.slots:
                        started = time.monotonic()
                        result: object = None
                        failure: Exception | None = None
                        try:
                            result = await self.run(pending)
                        except Exception as exc:
                            traced.failed(exc)
                            failure = exc
                        response = handler_response(queue.node_id, pending, result, failure)
                        self.pace.ran(time.monotonic() - started)
                finally:
                    self.unhandled -= 1
                    self.handler_done.set()
                try:
                    body, error = await queue._answer_body(response)
                except PrqError as exc:
                    body, error = None, exc
                if error is not None:
                    logger.error("could not answer request_id=%s error=%s", pending.id, error)
                if body is not None:
                    left = True  # (it leaves `_serving` once written)
                    await self.answers.answer(pending.id, body)
        finally:
            if not left:
                queue._serving.discard(pending.id)

    async def finish(self) -> None:
        """Wait until every held request is handled and answered."""
        if self.tasks:
            await asyncio.wait(self.tasks)
        await self.answers.flush()


class _AsyncAnswers:
    """The answers of one asyncio serve loop. A handler's task that finds fewer writes in
    flight than the node's link carries at once (MAX_ROUND_TRIPS_IN_FLIGHT) writes its answer
    at once, with every answer left meanwhile, batch after batch until nothing is left; one
    that finds them all busy leaves its answer and ends: a write in flight carries it next. So
    a lone answer goes out at once, and under load one round trip and one pass through the
    node's answer steps (AsyncQueue._write_answers) carry many answers, without a task waiting
    on each. A request stays held, counted by the loop's backlog (`unwritten`) and serving
    (AsyncQueue._serving), until the write that carries its answer ends."""

    def __init__(self, queue: AsyncQueue) -> None:
        self.queue = queue
        self.queued: list[tuple[str, bytes]] = []
        self.sending = 0  # answers in a write
        self.writers: set[asyncio.Task[None]] = set()
        self._written: asyncio.Event | None = None

    @property
    def unwritten(self) -> int:
        return len(self.queued) + self.sending

    def next_written(self) -> asyncio.Event:
        """Set when the next write ends."""
        if self._written is None:
            self._written = asyncio.Event()
        return self._written

    async def answer(self, request_id: str, body: bytes) -> None:
        """Leave an answer; with the link's writes not all in flight, write it (and what is
        left meanwhile) in this task at once, else return at once: a writer carries it."""
        self.queued.append((request_id, body))
        if len(self.writers) >= MAX_ROUND_TRIPS_IN_FLIGHT:
            return
        task = asyncio.current_task()
        assert task is not None
        self.writers.add(task)
        try:
            await self._write()
        finally:
            self.writers.discard(task)
            self.ensure_writing()  # (what a failed write left)

    def ensure_writing(self) -> None:
        """Start a writer if answers wait and the link has room for another write."""
        if self.queued and len(self.writers) < MAX_ROUND_TRIPS_IN_FLIGHT:
            self._start_writer()

    def _start_writer(self) -> None:
        writer = asyncio.ensure_future(self._write())
        self.writers.add(writer)
        writer.add_done_callback(self._writer_ended)

    def _writer_ended(self, writer: asyncio.Task[None]) -> None:
        self.writers.discard(writer)
        if writer.cancelled():
            return
        error = writer.exception()
        if error is not None:
            logger.error("answer writer failed error=%r", error, exc_info=error)
        self.ensure_writing()  # (what a failed writer left is written by another one)

    async def _write(self) -> None:
        """Write what is queued, batch after batch, until nothing is."""
        while self.queued:
            batch, self.queued = self.queued, []
            self.sending += len(batch)
            try:
                failed = await self.queue._write_answers(batch)
            finally:
                self.sending -= len(batch)
                for request_id, _ in batch:
                    self.queue._serving.discard(request_id)
                written, self._written = self._written, None
                if written is not None:
                    written.set()
            for request_id, error in failed.items():
                logger.error("could not answer request_id=%s error=%s", request_id, error)

    async def flush(self) -> None:
        """Wait until every answer left is written (or its write failed)."""
        for _ in range(FLUSH_ROUNDS):
            self.ensure_writing()
            if not self.writers:
                return
            await asyncio.wait(set(self.writers))


class _Pace:
    """How long a serve loop's handlers have been taking: an exponentially weighted mean of
    their runs. Taking ahead pays only while they are quick; a slow handler must not sit on
    requests that another receiver could run."""

    __slots__ = ("mean_s",)

    def __init__(self) -> None:
        self.mean_s: float | None = None

    def ran(self, seconds: float) -> None:
        mean = self.mean_s
        self.mean_s = seconds if mean is None else mean + PACE_WEIGHT * (seconds - mean)

    @property
    def quick(self) -> bool:
        return self.mean_s is not None and self.mean_s < TAKE_AHEAD_BELOW_S


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
        # in the task's context (as asyncio.to_thread): the handler sees its trace span
        run = contextvars.copy_context().run
        return await loop.run_in_executor(executor, run, _run_sync_handler, handler, pending)

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

    turns = _TakeTurns(queue, endpoint, stopped, pause, concurrency)
    answers = _AnswerTurns(queue)

    def work() -> None:
        pending: PendingRequest | None = None
        while True:
            pending, going = turns.next_request(ran=pending is not None)
            if pending is not None:
                _answer(queue, handler, pending, answers, turns.pace)
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
            # Python handler (SIGTERM's stop, prq.serve.sigterm) when the main thread next wakes.
            while worker.is_alive():
                worker.join(JOIN_WAKE_S)
    logger.info("stopped serving endpoint=%r", endpoint)


class _TakeTurns:
    """The workers of one `serve_sync`: one idle worker at a time takes from Redis, for itself
    and for every worker waiting meanwhile; what it takes beyond its own first request waits
    in a backlog for the others (held, so beaten for, and counted as serving at once).

    Only as many workers are woken for the backlog as the handlers' pace asks for (`helpers`):
    one per SHARE_S of expected handler time, and one to take next. Quick handlers run one
    after another on a few threads (a wake-up costs a thread more CPU than an echo handler's
    whole run: waking one per request halved a drain's rate); slow ones get a thread each, as
    before the pace is known. A worker that takes a request from the backlog wakes one more
    while what is left is more than SHARE_S of work. A run far slower than the average holds
    the requests behind it until a sleeping worker's timed wait (JOIN_WAKE_S) finds them.

    While the handlers are quick (_Pace.quick) the workers take ahead, as the asyncio loop
    does: a worker that finds little left in the backlog (TAKE_AHEAD_LEFT_S) takes the next
    batch while the others run what is left, so Redis hands it out meanwhile; up to twice
    `concurrency` requests are then held (run, or waiting in the backlog). Such a take does not
    park when nothing waits in Redis: the worker is one of the handlers' threads, and goes on
    to run what is left."""

    def __init__(
        self,
        queue: Queue,
        endpoint: str,
        stopped: Callable[[], bool],
        pause: threading.Event,
        concurrency: int = 1,
    ) -> None:
        self.queue = queue
        self.endpoint = endpoint
        self.stopped = stopped
        self.pause = pause
        self.concurrency = concurrency
        self.turns = threading.Condition()
        self.backlog: collections.deque[PendingRequest] = collections.deque()
        self.taking = False  # a worker is taking from Redis
        self.waiting = 0  # workers waiting for a request while another one takes
        self.running = 0  # requests a worker got and has not come back from
        self.failures = 0
        #: How long the handlers run (each worker adds its runs; a lost update is harmless).
        self.pace = _Pace()

    def helpers(self, left: int) -> int:
        """How many more workers `left` requests waiting in the backlog need (call with the
        turns held)."""
        mean_s = self.pace.mean_s
        if left <= 0 or mean_s is None:
            return max(0, left)
        return max(1, min(left, math.ceil(left * mean_s / SHARE_S)))

    def room(self) -> int:
        """How many requests a take may bring now: up to `concurrency` held (twice that while
        the handlers are quick), counting those running and those in the backlog (call with
        the turns held)."""
        held = self.concurrency * (2 if self.pace.quick else 1)
        return held - self.running - len(self.backlog)

    def _takes_ahead(self) -> bool:
        """Whether the calling worker, which finds requests in the backlog, should take the
        next batch first: the handlers are quick, other workers can run what is left, and
        that is little (call with the turns held)."""
        mean_s = self.pace.mean_s
        return (
            self.concurrency > 1
            and not self.taking
            and mean_s is not None
            and self.pace.quick
            and len(self.backlog) * mean_s <= TAKE_AHEAD_LEFT_S
            and self.room() > 0
            and not self.stopped()
        )

    def next_request(self, ran: bool = False) -> tuple[PendingRequest | None, bool]:
        """The next request for the calling worker (None: none this turn), taken for it and
        the waiting others if none waits (or taken ahead, see the class); and whether the
        worker should go on. `ran`: the worker comes back from running a request."""
        with self.turns:
            if ran:
                self.running -= 1
            while not self.backlog and self.taking and not self.stopped():
                self.waiting += 1
                self.turns.wait(JOIN_WAKE_S)
                self.waiting -= 1
            ahead = bool(self.backlog) and self._takes_ahead()
            if self.backlog and not ahead:
                pending = self.backlog.popleft()
                self.running += 1
                if self.backlog and self.waiting and self.helpers(len(self.backlog)) > 1:
                    self.turns.notify(1)  # (more work left than this worker does soon)
                return pending, True
            if self.stopped():
                return None, False
            self.taking = True
            want = max(1, self.room())
            if self.backlog and self.waiting:
                self.turns.notify(1)  # (to run what is left while this worker takes)
        taken: list[PendingRequest] = []
        try:
            # (a take ahead does not park: the worker runs what is left if nothing waits)
            timeout_s = 0.0 if ahead else self.queue.settings.dequeue_timeout_s
            taken = self.queue._take(self.endpoint, want, timeout_s, self.stopped)
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
                self.backlog.extend(taken)  # (behind what was left: taken ahead)
                # the workers the requests left over need (one each until the handlers' pace
                # is known), and one to take next; this one runs the first
                self.turns.notify(self.helpers(len(self.backlog) - 1) + 1)
        with self.turns:
            mine = self.backlog.popleft() if self.backlog else None
            if mine is not None:
                self.running += 1
        return mine, True


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


def _answer(
    queue: Queue, handler: Handler, pending: PendingRequest, answers: _AnswerTurns, pace: _Pace
) -> None:
    queue._serving.add(pending.id)
    body: bytes | None = None
    try:
        with tracing.processing(pending, queue.node_id) as traced:
            started = time.monotonic()
            result: object = None
            failure: Exception | None = None
            try:
                result = _run_sync_handler(handler, pending)
            except Exception as exc:
                traced.failed(exc)
                failure = exc
            response = handler_response(queue.node_id, pending, result, failure)
            pace.ran(time.monotonic() - started)
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
