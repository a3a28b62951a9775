"""One test body, two facades: `AsyncQueue` as it is, and `Queue` behind an awaitable adapter.

Integration tests are `async def`. On the "async" facade they drive `prq.AsyncQueue` directly; on
the "sync" facade they drive `SyncQueueAdapter`, whose methods run the blocking `prq.Queue`
call in a dedicated thread pool (`loop.run_in_executor`), so many blocking calls can wait at
once while the test's event loop stays free. Attributes that are not calls (`keys`, `node_id`,
`settings`, `stats`) are read from the wrapped queue.

`QueueFactory` builds queues on one test's key prefix with small timings, starts `serve` loops
(an asyncio task, or a thread with a `threading.Event`), and stops and closes all of them,
bounded, at teardown.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeAlias, TypeVar

from prq import AsyncQueue, DataLoss, Queue, QueueSettings, RedisSettings, Request, RequestState
from prq.datastreams import DataStreamStore
from prq.facade.send import BlockingSendHandle
from tests.redis_servers import async_wait_until

__all__ = [
    "FAST_SETTINGS",
    "AnyQueue",
    "QueueFactory",
    "RunningCount",
    "Serving",
    "SyncQueueAdapter",
    "run_all",
    "wait_for_state",
]

T = TypeVar("T")

#: Small timings for tests: a lost pulse costs 0.5 s, an idle dequeue 1 s, and a failing Redis
#: surfaces after 5 s instead of 30 s.
FAST_SETTINGS: dict[str, Any] = {
    "poll_interval_s": 0.5,
    "dequeue_timeout_s": 1.0,
    "pickup_timeout_s": 5.0,
    "retry_budget_s": 5.0,
}
#: Threads available to blocking calls of the sync facade (one per waiting call).
SYNC_FACADE_THREADS = 256
#: How long teardown waits for a serve loop to stop, or for blocked threads to return.
STOP_TIMEOUT_S = 15.0


class SyncQueueAdapter:
    """`prq.Queue` with awaitable methods: each blocking call runs in a worker thread."""

    facade = "sync"

    def __init__(self, queue: Queue, executor: ThreadPoolExecutor) -> None:
        self.raw = queue
        self._executor = executor
        self._futures: set[Future[Any]] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)

    async def _run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        future = self._executor.submit(functools.partial(fn, *args, **kwargs))
        self._futures.add(future)
        future.add_done_callback(self._futures.discard)
        return await asyncio.wrap_future(future)

    @property
    def busy_threads(self) -> int:
        return sum(1 for f in list(self._futures) if not f.done())

    async def start(self) -> None:
        await self._run(self.raw.start)

    async def aclose(self) -> None:
        await self._run(self.raw.close)

    async def queue_and_wait(self, request: Any, **kwargs: Any) -> Any:
        return await self._run(self.raw.queue_and_wait, request, **kwargs)

    async def call(self, *args: Any, **kwargs: Any) -> Any:
        return await self._run(self.raw.call, *args, **kwargs)

    async def dequeue(self, endpoint: str, **kwargs: Any) -> Any:
        return await self._run(self.raw.dequeue, endpoint, **kwargs)

    async def dequeue_many(self, endpoint: str, max_items: int, **kwargs: Any) -> Any:
        return await self._run(self.raw.dequeue_many, endpoint, max_items, **kwargs)

    async def apply_response(self, response: Any) -> None:
        await self._run(self.raw.apply_response, response)

    async def cancel(self, request_id: str) -> bool:
        return await self._run(self.raw.cancel, request_id)

    async def status(self, request_id: str) -> Any:
        return await self._run(self.raw.status, request_id)

    async def dead_letters(self, endpoint: str, **kwargs: Any) -> Any:
        return await self._run(self.raw.dead_letters, endpoint, **kwargs)

    async def replay_dead_letter(self, endpoint: str, request_id: str) -> Any:
        return await self._run(self.raw.replay_dead_letter, endpoint, request_id)

    async def purge_dead_letters(self, endpoint: str, request_ids: Any = None) -> Any:
        return await self._run(self.raw.purge_dead_letters, endpoint, request_ids)

    async def limits(self, endpoint: str) -> Any:
        return await self._run(self.raw.limits, endpoint)

    async def set_limits(self, endpoint: str, **kwargs: Any) -> Any:
        return await self._run(self.raw.set_limits, endpoint, **kwargs)

    async def notify(self, *args: Any, **kwargs: Any) -> str:
        return await self._run(self.raw.notify, *args, **kwargs)

    async def send(self, request: Any, **kwargs: Any) -> SyncSendHandleAdapter:
        handle = await self._run(self.raw.send, request, **kwargs)
        return SyncSendHandleAdapter(handle, self)


class SyncSendHandleAdapter:
    """`prq.facade.send.BlockingSendHandle` with an awaitable `withdraw()`."""

    def __init__(self, handle: BlockingSendHandle, queue: SyncQueueAdapter) -> None:
        self.raw = handle
        self._queue = queue

    @property
    def request_id(self) -> str:
        return self.raw.request_id

    @property
    def done(self) -> bool:
        return self.raw.done

    @property
    def finished(self) -> bool:
        return self.raw.finished

    async def withdraw(self) -> bool:
        return await self._queue._run(self.raw.withdraw)


AnyQueue: TypeAlias = AsyncQueue | SyncQueueAdapter


class Serving:
    """A running `serve` loop (task or thread) that the test can stop and join, bounded."""

    def __init__(
        self,
        *,
        task: asyncio.Task[None] | None = None,
        async_stop: asyncio.Event | None = None,
        thread: threading.Thread | None = None,
        thread_stop: threading.Event | None = None,
    ) -> None:
        self._task = task
        self._async_stop = async_stop
        self._thread = thread
        self._thread_stop = thread_stop
        self.error: BaseException | None = None
        self.stopped = False

    @property
    def running(self) -> bool:
        if self._task is not None:
            return not self._task.done()
        assert self._thread is not None
        return self._thread.is_alive()

    async def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Ask the loop to stop, wait (bounded) until it has, and re-raise what it raised."""
        if self.stopped:
            return
        self.stopped = True
        if self._task is not None:
            assert self._async_stop is not None
            self._async_stop.set()
            done, _ = await asyncio.wait({self._task}, timeout=timeout_s)
            if not done:
                self._task.cancel()
                raise AssertionError(f"serve loop did not stop within {timeout_s:g} s")
            self._task.result()
            return
        assert self._thread is not None and self._thread_stop is not None
        self._thread_stop.set()
        thread = self._thread
        await async_wait_until(
            lambda: not thread.is_alive(), timeout_s, 0.02, "serve thread stopped"
        )
        if self.error is not None:
            raise self.error


class QueueFactory:
    """Builds queues of one facade on one test's prefix; closes everything at teardown."""

    def __init__(self, facade: str, url: str, prefix: str) -> None:
        if facade not in ("async", "sync"):
            raise ValueError(f"unknown facade {facade!r}")
        self.facade = facade
        self.url = url
        self.prefix = prefix
        self._queues: list[AnyQueue] = []
        self._servings: list[Serving] = []
        self._executor: ThreadPoolExecutor | None = None

    def settings(self, **overrides: Any) -> QueueSettings:
        return QueueSettings(**{**FAST_SETTINGS, **overrides})

    def __call__(
        self,
        *,
        url: str | None = None,
        prefix: str | None = None,
        node_id: str | None = None,
        redis_settings: RedisSettings | None = None,
        datastreams: DataStreamStore | None = None,
        **overrides: Any,
    ) -> AnyQueue:
        """A new queue (a new node) with FAST_SETTINGS updated by `overrides`."""
        redis_settings = redis_settings or RedisSettings.from_url(url or self.url)
        kwargs: dict[str, Any] = {
            "prefix": prefix or self.prefix,
            "settings": self.settings(**overrides),
            "node_id": node_id,
            "datastreams": datastreams,
        }
        queue: AnyQueue
        if self.facade == "async":
            queue = AsyncQueue(redis_settings, **kwargs)
        else:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    SYNC_FACADE_THREADS, thread_name_prefix="sync-facade"
                )
            queue = SyncQueueAdapter(Queue(redis_settings, **kwargs), self._executor)
        self._queues.append(queue)
        return queue

    def serve(
        self, queue: AnyQueue, endpoint: str, handler: Callable[..., Any], *, concurrency: int = 1
    ) -> Serving:
        """Start `queue.serve(endpoint, handler)` in the background; stopped at teardown."""
        serving: Serving
        if isinstance(queue, SyncQueueAdapter):
            stop = threading.Event()

            def run() -> None:
                try:
                    queue.raw.serve(endpoint, handler, concurrency=concurrency, stop=stop)
                except BaseException as exc:  # re-raised by Serving.stop()
                    serving.error = exc

            thread = threading.Thread(target=run, name=f"serve-{endpoint[:20]}", daemon=True)
            serving = Serving(thread=thread, thread_stop=stop)
            thread.start()
        else:
            event = asyncio.Event()
            task = asyncio.create_task(
                queue.serve(endpoint, handler, concurrency=concurrency, stop=event)
            )
            serving = Serving(task=task, async_stop=event)
        self._servings.append(serving)
        return serving

    async def aclose(self) -> None:
        """Stop serve loops, close queues, and wait (bounded) for blocked threads to return."""
        errors: list[BaseException] = []
        for serving in self._servings:
            try:
                await serving.stop()
            except BaseException as exc:
                errors.append(exc)
        for queue in self._queues:
            try:
                await asyncio.wait_for(queue.aclose(), STOP_TIMEOUT_S)
            except BaseException as exc:
                errors.append(exc)
        adapters = [q for q in self._queues if isinstance(q, SyncQueueAdapter)]
        if adapters:
            await async_wait_until(
                lambda: all(a.busy_threads == 0 for a in adapters),
                STOP_TIMEOUT_S,
                0.02,
                "blocking calls returned after close",
            )
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        # Cancel what the test left running on its loop (it would die with the loop anyway)...
        current = asyncio.current_task()
        leftovers = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
        for task in leftovers:
            task.cancel()
        if leftovers:
            await asyncio.wait(leftovers, timeout=STOP_TIMEOUT_S)
        # ...then drop our references and collect now, so a resource that a closed queue leaked
        # (an unclosed connection) is reported against this test, not the next one.
        self._queues.clear()
        self._servings.clear()
        gc.collect()
        if errors:
            raise errors[0]


class RunningCount:
    """A plain handler that counts how many of its calls run at the same time (`most`), each
    working `work_s` (the work itself; the count is what a test watches), and echoes the
    params."""

    def __init__(self, work_s: float) -> None:
        self.work_s = work_s
        self.now = 0
        self.most = 0
        self._lock = threading.Lock()

    def __call__(self, request: Request) -> Any:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(self.work_s)  # the handler's work, not a synchronisation
        with self._lock:
            self.now -= 1
        return request.params


async def wait_for_state(
    queue: AnyQueue, request_id: str, state: RequestState, timeout_s: float = 10.0
) -> None:
    """Wait (bounded) until `status(request_id)` reports `state`."""

    async def reached() -> bool:
        return (await queue.status(request_id)).state == state

    await async_wait_until(reached, timeout_s, 0.01, f"request {request_id} {state}")


async def call_after_loss(
    caller: Any, endpoint: str, method: str, params: object, timeout_s: float = 30.0
) -> object:
    """A call made right after a data loss, retried as its caller would: one enqueued before
    the receiver's first counter reading since the loss came back is refused with the requests
    queued before it (DataLoss, retryable; README "Redis loses data"). At most 3 tries."""
    for attempt in range(3):
        try:
            return await asyncio.wait_for(caller.call(endpoint, method, params), timeout_s)
        except DataLoss:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


async def run_all(coros: Iterable[Coroutine[Any, Any, T]], timeout_s: float) -> list[T]:
    """Run coroutines at once and return their results in order, bounded by `timeout_s`.

    Unlike `asyncio.gather`, the first failure cancels and awaits the others (TaskGroup), so a
    failing test leaves no calls running into the next one.
    """
    async with asyncio.timeout(timeout_s), asyncio.TaskGroup() as group:
        tasks = [group.create_task(coro) for coro in coros]
    return [task.result() for task in tasks]
