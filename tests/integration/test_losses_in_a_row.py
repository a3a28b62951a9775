"""Several data losses in a row are each a non-event for what comes after them: under a steady
load from both facades, every call made once a loss is declared runs, after a second and a third
loss as after the first (issue 39, item 1); a flush on a young endpoint is declared at the next
enqueue or take, not the next periodic check (item 2); and a batch enqueued across a flush runs
every request written after it, says that Redis lost data while it wrote (a loss watch), and a
rerun with its ledger queues exactly what the flush took (item 6).

Only public behaviour is judged here (calls, their errors, the nodes' count of declared losses),
so the same tests tell the design before this one from this one.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
import redis

from prq import PrqError, Request
from prq.bulk import BulkClient, BulkResult, Ledger, LossWatch
from prq.core.models import encode_stored_request
from prq.embedded import EmbeddedRedis
from tests.queue_facades import AnyQueue, QueueFactory, SyncQueueAdapter
from tests.queued import queue_depth
from tests.redis_servers import async_wait_until, wait_until

pytestmark = pytest.mark.integration

#: A check every second: a loss the canary alone shows is declared within about that.
TIMINGS: dict[str, Any] = {"data_loss_check_interval_s": 1.0, "pickup_timeout_s": 10.0}
ENDPOINT = "poll://steady"
#: Calls made after each declaration, each of which must run.
AFTER = 20


def events(queue: AnyQueue) -> int:
    raw = queue.raw if isinstance(queue, SyncQueueAdapter) else queue
    return raw.stats.data_loss_events


class SteadyLoad:
    """Calls one after another, each recorded with when it was made and how it ended."""

    def __init__(self, queue: AnyQueue) -> None:
        self.queue = queue
        #: (made, ended, outcome) of every call
        self.ended: list[tuple[float, float, str]] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            made = time.monotonic()
            try:
                answer = await asyncio.wait_for(self.queue.call(ENDPOINT, "m", n), 20)
                outcome = "ok" if answer == n else f"wrong answer {answer!r}"
            except (PrqError, TimeoutError) as exc:
                outcome = type(exc).__name__
            self.ended.append((made, time.monotonic(), outcome))
            n += 1
            await asyncio.sleep(0.02)  # (a light load: about 30 calls a second)

    async def stop(self) -> None:
        self._stop.set()
        assert self._task is not None
        await asyncio.wait_for(self._task, 30)

    def failed_between(self, start: float, end: float) -> list[str]:
        """How the calls made after `start` and ended before `end` failed."""
        return [
            outcome
            for made, ended, outcome in self.ended
            if start < made and ended < end and outcome != "ok"
        ]


async def lose(how: str, server: EmbeddedRedis, client: redis.Redis) -> None:
    if how == "flush":
        client.flushall()
    else:
        await asyncio.to_thread(server.restart)


@pytest.mark.parametrize(
    "losses", [("flush", "flush", "flush"), ("restart", "flush", "restart")], ids="-".join
)
async def test_every_call_made_after_each_of_three_losses_in_a_row_runs(
    make_own_queue: QueueFactory,
    own_redis: EmbeddedRedis,
    own_redis_client: redis.Redis,
    losses: tuple[str, ...],
) -> None:
    # Given a worker serving an endpoint and a caller under a light steady load
    sender = make_own_queue(**TIMINGS)
    receiver = make_own_queue(**TIMINGS)
    make_own_queue.serve(receiver, ENDPOINT, lambda request: request.params)
    assert await asyncio.wait_for(sender.call(ENDPOINT, "m", -1), 10) == -1
    load = SteadyLoad(sender)
    load.start()
    declared: list[float] = []
    lost: list[float] = []
    for n, how in enumerate(losses, 1):
        # (a while of load first: calls numbered since the last loss, a floor to judge by)
        await async_wait_until(
            lambda: len(load.ended) >= 10 * n,  # noqa: B023
            20,
            0.02,
            "some calls ran",
        )
        # When Redis loses its data again, and both nodes declared it
        lost.append(time.monotonic())
        await lose(how, own_redis, own_redis_client)
        await async_wait_until(
            lambda: events(sender) >= n and events(receiver) >= n,  # noqa: B023
            15,
            0.01,
            f"loss {n} ({how}) declared by both nodes",
        )
        declared.append(time.monotonic())
        # Then every call made from then on runs
        for k in range(AFTER):
            assert await asyncio.wait_for(sender.call(ENDPOINT, "m", k), 15) == k, (n, how, k)
    await load.stop()
    # And so did every call of the steady load made after a declaration that ended before the
    # next loss
    for n, moment in enumerate(declared):
        until = lost[n + 1] if n + 1 < len(lost) else time.monotonic()
        assert load.failed_between(moment, until) == [], (n, losses)
    assert (events(sender), events(receiver)) == (len(losses), len(losses))


async def test_a_flush_on_a_young_endpoint_is_declared_at_the_next_call_not_the_next_check(
    make_own_queue: QueueFactory, own_redis_client: redis.Redis
) -> None:
    # Given a worker and a caller with the default data-loss check (every 60 s), and an endpoint
    # they met a moment ago (on the old design, 47-53 s passed before a loss was declared)
    sender = make_own_queue(pickup_timeout_s=10.0)
    receiver = make_own_queue(pickup_timeout_s=10.0)
    make_own_queue.serve(receiver, "poll://young", lambda request: request.params)
    for n in range(3):
        assert await asyncio.wait_for(sender.call("poll://young", "m", n), 10) == n
    # When Redis is flushed, and a call made
    own_redis_client.flushall()
    flushed = time.monotonic()
    assert await asyncio.wait_for(sender.call("poll://young", "m", 9), 10) == 9
    # Then the sender declared the loss within seconds (its enqueue found no numbers where it
    # had read some, and checked at once), and calls go on; the receiver, which held nothing
    # the flush took, declares it at its next check (60 s), which changes nothing: nothing
    # queued after a loss is refused
    await async_wait_until(lambda: events(sender) == 1, 10, 0.02, "declared")
    print(f"declared {time.monotonic() - flushed:.2f} s after the flush")
    assert time.monotonic() - flushed < 10  # (the periodic check would come at 60 s)
    for n in range(10):
        assert await asyncio.wait_for(sender.call("poll://young", "m", n), 10) == n


async def test_requests_a_batch_writes_after_a_flush_all_run(
    make_own_queue: QueueFactory, own_redis: EmbeddedRedis, own_redis_client: redis.Redis
) -> None:
    # Given a worker that declares a flush within a second, and has run requests before
    receiver = make_own_queue(data_loss_check_interval_s=1.0)
    ran: list[str] = []

    def handle(request: Any) -> None:
        ran.append(request.id)

    make_own_queue.serve(receiver, "poll://batch", handle)
    bulk = BulkClient.from_url(
        own_redis.url, settings=receiver.settings, prefix=receiver.keys.prefix
    )

    def batch(ids: list[str]) -> int:
        requests = [Request(id=i, endpoint="poll://batch", method="m") for i in ids]
        return bulk.enqueue_many(requests, pickup_timeout_s=60).accepted

    try:
        assert batch([f"a{i}" for i in range(200)]) == 200
        await async_wait_until(lambda: len(ran) == 200, 20, 0.02, "the first batch ran")
        # When Redis is flushed, the worker declares it, and more batches are enqueued, some
        # while the loss is not yet declared
        own_redis_client.flushall()
        later = [f"b{i}" for i in range(600)]
        for start in range(0, 600, 100):
            assert batch(later[start : start + 100]) == 100
            if start == 200:
                await async_wait_until(lambda: events(receiver) >= 1, 15, 0.02, "declared")
        # Then every request written after the flush runs: none is refused as queued before it
        await async_wait_until(
            lambda: set(later) <= set(ran), 30, 0.05, "every request written after the flush ran"
        )
        assert events(receiver) == 1
    finally:
        bulk.close()


async def test_requests_written_after_a_flush_and_queued_when_it_is_declared_all_run(
    make_own_queue: QueueFactory, own_redis: EmbeddedRedis, own_redis_client: redis.Redis
) -> None:
    # Given a worker that has run many requests, and Redis flushed (the Spark job: rows
    # written after the flush, still queued behind a busy worker when the loss was declared,
    # were refused as queued before it, 74,729 of them)
    receiver = make_own_queue(data_loss_check_interval_s=1.0)
    ran: list[str] = []
    busy = threading.Event()
    go_on = threading.Event()

    def handle(request: Any) -> None:
        if request.id == "b0":
            busy.set()
            go_on.wait(20)
        ran.append(request.id)

    make_own_queue.serve(receiver, "poll://held-up", handle, concurrency=1)
    bulk = BulkClient.from_url(
        own_redis.url, settings=receiver.settings, prefix=receiver.keys.prefix
    )

    def batch(ids: list[str]) -> int:
        requests = [Request(id=i, endpoint="poll://held-up", method="m") for i in ids]
        return bulk.enqueue_many(requests, pickup_timeout_s=60).accepted

    try:
        assert batch([f"a{i}" for i in range(300)]) == 300
        await async_wait_until(lambda: len(ran) == 300, 20, 0.02, "the first batch ran")
        own_redis_client.flushall()
        # When requests are written after the flush while the worker is held up by one of
        # them, and the loss is declared while they wait
        assert batch(["b0"]) == 1
        await async_wait_until(busy.is_set, 10, 0.01, "the worker busy")
        later = [f"b{i}" for i in range(1, 200)]
        assert batch(later) == 199
        await async_wait_until(lambda: events(receiver) >= 1, 15, 0.02, "declared")
        go_on.set()
        # Then every one of them runs: none is refused as queued before the loss
        await async_wait_until(
            lambda: set(later) <= set(ran), 30, 0.05, "every request written after the flush ran"
        )
    finally:
        go_on.set()
        bulk.close()


async def test_a_bulk_enqueue_across_a_flush_says_so_and_a_rerun_runs_each_request_once(
    make_own_queue: QueueFactory, own_redis: EmbeddedRedis, own_redis_client: redis.Redis
) -> None:
    # Given a job of 600 requests enqueued in one call, 100 per round trip, with a loss watch
    # and the job's ledger, and Redis flushed once it holds the first 200 (before any worker
    # runs, so that none of them ran: a flush takes the ledger's note of what ran too)
    receiver = make_own_queue(data_loss_check_interval_s=1.0)
    bulk = BulkClient.from_url(
        own_redis.url, settings=receiver.settings, prefix=receiver.keys.prefix
    )
    endpoint, ledger = "poll://signal", Ledger("signal-job")
    keys = bulk.keys.endpoint(endpoint)
    ids = [f"signal-job:{n}" for n in range(600)]

    def job() -> Iterator[Request]:
        for n, rid in enumerate(ids):
            if n == 300:  # (read a batch ahead of the one in flight)
                wait_until(lambda: queue_depth(own_redis_client, keys) >= 200, 10, 0.005, "200")
                own_redis_client.flushall()
            yield Request(id=rid, endpoint=endpoint, method="m")

    def enqueue(requests: Iterable[Request]) -> BulkResult:
        return bulk.enqueue_many(
            requests, batch_size=100, pickup_timeout_s=60, ledger=ledger, watch=LossWatch()
        )

    ran: list[str] = []
    try:
        # When the job runs
        first = await asyncio.to_thread(enqueue, job())

        # Then it counts every request accepted, and says that Redis lost data while it wrote
        assert (first.accepted, first.duplicates, first.data_loss) == (600, 0, True)

        # And a job with no loss says none, at the cost of no round trip more: one command
        # per round trip (its first one more), beside two per batch
        def costs(endpoint: str, watch: LossWatch | None) -> tuple[int, int, bool]:
            requests = [Request(id=f"q:{n}", endpoint=endpoint, method="m") for n in range(300)]
            before = (bulk._io.round_trips, bulk._io.commands)
            result = bulk.enqueue_many(requests, batch_size=100, watch=watch)
            assert result.accepted == 300
            return (
                bulk._io.round_trips - before[0], bulk._io.commands - before[1], result.data_loss
            )  # fmt: skip

        plain_trips, plain_commands, _ = await asyncio.to_thread(costs, "poll://a", None)
        watched = await asyncio.to_thread(costs, "poll://b", LossWatch())
        assert watched == (plain_trips, plain_commands + 3 + 1, False)
        gone = [rid for rid in ids if not own_redis_client.exists(keys.request(rid))]
        assert len(gone) >= 200

        # When a worker serves the endpoint, and the job runs again with the same ledger
        make_own_queue.serve(receiver, endpoint, lambda request: ran.append(request.id))
        again = await asyncio.to_thread(
            enqueue, (Request(id=rid, endpoint=endpoint, method="m") for rid in ids)
        )

        # Then it queues exactly the requests the flush took, and finds no loss
        assert (again.accepted, again.duplicates, again.data_loss) == (
            len(gone),
            600 - len(gone),
            False,
        )
        # And every request of the job runs, once
        await async_wait_until(lambda: len(ran) >= 600, 30, 0.05, "every request ran")
        await async_wait_until(
            lambda: queue_depth(own_redis_client, keys) == 0, 10, 0.05, "nothing left queued"
        )
        assert Counter(ran) == Counter(ids)
    finally:
        bulk.close()


def test_a_loss_watch_passed_to_several_enqueues_tells_a_flush_between_them(
    own_redis: EmbeddedRedis, own_redis_client: redis.Redis
) -> None:
    # Given one watch a task passes to each batch it sends (as a Spark task does)
    with BulkClient.from_url(own_redis.url) as bulk:
        watch = LossWatch()
        bodies = [(f"w:{n}", encode_stored_request(Request(endpoint="poll://w", method="m")))
                  for n in range(30)]  # fmt: skip

        def send(part: range) -> BulkResult:
            return bulk.enqueue_encoded("poll://w", [bodies[n] for n in part], watch=watch)

        first, second = send(range(0, 10)), send(range(10, 20))
        assert (first.accepted, first.data_loss, second.accepted, second.data_loss) == (
            10, False, 10, False
        )  # fmt: skip
        # When Redis is flushed between two batches
        own_redis_client.flushall()
        # Then the next batch says so, and so does every later one (what the earlier ones
        # wrote is gone, whatever comes next)
        third = send(range(20, 30))
        assert (third.accepted, third.data_loss) == (10, True)
        assert send(range(20, 30)).data_loss and watch.lost
        assert bulk.enqueue_encoded("poll://w", [], watch=watch).data_loss
