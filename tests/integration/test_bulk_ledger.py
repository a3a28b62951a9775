"""A dedup ledger (prq.bulk.Ledger) on real Redis and real receivers, both facades: an id a
receiver took is not queued again once its record is gone; one no receiver took is."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

import pytest
import redis

from prq import QueueSettings, Request
from prq.bulk import TAKEN_BEFORE, BulkClient, Ledger, LossWatch
from prq.core.keys import ledger_token
from prq.embedded import EmbeddedRedis
from tests.queue_facades import FAST_SETTINGS, QueueFactory
from tests.queued import queue_depth, silent_take
from tests.redis_servers import async_wait_until
from tests.stored_bodies import record_fields

pytestmark = pytest.mark.integration

ENDPOINT = "poll://ledgered"
IDLE = "poll://ledgered-idle"
#: Answers kept half a second (each request asks for it), so their records go soon.
BRIEF_S = 0.5


@pytest.fixture
def bulk(redis_url: str, key_prefix: str) -> Iterator[BulkClient]:
    settings = QueueSettings(**{**FAST_SETTINGS, "request_ttl_extra_s": 0.3})
    with BulkClient.from_url(redis_url, prefix=key_prefix, settings=settings) as client:
        yield client


def rows(run: str, n: int) -> list[Request]:
    return [
        Request(endpoint=ENDPOINT, method="m", params=i, id=f"{run}:{i}", response_ttl_s=BRIEF_S)
        for i in range(n)
    ]


def gone(client: redis.Redis, bulk: BulkClient, requests: list[Request]) -> bool:
    keys = bulk.keys.endpoint(ENDPOINT)
    return client.exists(*[keys.request(r.id) for r in requests]) == 0


# (3: each record spelled by the script; 10: the batch sent whole, with a shared head)
@pytest.mark.parametrize("n", [3, 10])
async def test_an_id_a_receiver_took_is_not_queued_again_once_its_record_is_gone(
    bulk: BulkClient, make_queue: QueueFactory, redis_client: redis.Redis, n: int
) -> None:
    # Given requests enqueued with a ledger, each run once by a receiver, whose answers (and
    # records) are gone since
    runs: Counter[str] = Counter()
    lock = threading.Lock()

    def handler(request: Request) -> object:
        with lock:
            runs[request.id] += 1
        return request.params

    make_queue.serve(make_queue(), ENDPOINT, handler, concurrency=4)
    requests = rows("job-1", n)
    ledger = Ledger("job-1", ttl_s=3600)
    assert bulk.enqueue_many(requests, ledger=ledger).accepted == n
    await async_wait_until(lambda: len(runs) == n, 20, 0.02, "every request run")
    await async_wait_until(lambda: gone(redis_client, bulk, requests), 20, 0.05, "records gone")

    # When the same ids are enqueued again with the same ledger (a rerun)
    again = bulk.enqueue_many(requests, ledger=ledger)

    # Then none is queued: each is a duplicate whose outcome has expired, and none runs again
    assert (again.accepted, again.duplicates) == (0, n)
    assert (
        sorted(again.expired_ids) == sorted(again.duplicate_ids) == sorted(r.id for r in requests)
    )
    assert queue_depth(redis_client, bulk.keys.endpoint(ENDPOINT)) == 0
    assert gone(redis_client, bulk, requests)
    assert set(runs.values()) == {1}
    # And without the ledger they would have been queued again
    assert bulk.enqueue_many(requests).accepted == n


async def test_an_outcome_read_after_an_answer_expired_says_the_ledger_saw_it_taken(
    bulk: BulkClient, make_queue: QueueFactory, redis_client: redis.Redis
) -> None:
    # Given requests enqueued with a ledger (and read, known, by a rerun's enqueue) whose
    # answers expired before their outcomes were read, and one no receiver took, expired too
    make_queue.serve(make_queue(), ENDPOINT, lambda request: request.params, concurrency=4)
    ran = rows("job-6", 3)
    never = [rows("job-6b", 1)[0].model_copy(update={"endpoint": IDLE})]  # (nobody serves it)
    ledger = Ledger("job-6", ttl_s=3600)
    assert bulk.enqueue_many(ran, ledger=ledger).accepted == 3
    ids = [r.id for r in ran]
    await async_wait_until(
        lambda: {s.state for s in bulk.outcomes(ENDPOINT, ids).values()} == {"done"},
        20, 0.02, "answered",
    )  # fmt: skip
    assert bulk.enqueue_many(ran, ledger=ledger).duplicates == 3  # a rerun: known
    never_ledger = Ledger("job-6b", ttl_s=3600)
    bulk.enqueue_many(never, pickup_timeout_s=0.2, ledger=never_ledger)
    idle = bulk.keys.endpoint(IDLE).request(never[0].id)
    await async_wait_until(lambda: gone(redis_client, bulk, ran), 20, 0.05, "answers expired")
    await async_wait_until(lambda: not redis_client.exists(idle), 20, 0.05, "expired unread")

    # When their outcomes are read with the ledger, and without
    found = bulk.outcomes(ENDPOINT, ids, ledger=ledger)
    plain = bulk.outcomes(ENDPOINT, ids)
    unknown = bulk.outcomes(IDLE, [never[0].id], ledger=never_ledger)

    # Then with the ledger each is missing because it was taken before (it ran: its answer
    # expired), not missing for no known reason; the one nobody took is plainly missing
    assert {(s.state, s.reason) for s in found.values()} == {("missing", TAKEN_BEFORE)}
    assert {(s.state, s.reason) for s in plain.values()} == {("missing", "")}
    assert (unknown[never[0].id].state, unknown[never[0].id].reason) == ("missing", "")


async def test_an_id_no_receiver_took_is_queued_afresh(
    bulk: BulkClient, redis_client: redis.Redis
) -> None:
    # Given a request enqueued with a ledger that nobody took before its record expired
    request = rows("job-2", 1)[0]
    ledger = Ledger("job-2", ttl_s=3600)
    assert bulk.enqueue_many([request], pickup_timeout_s=0.2, ledger=ledger).accepted == 1
    await async_wait_until(lambda: gone(redis_client, bulk, [request]), 20, 0.05, "expired")

    # When it is enqueued again with the ledger
    again = bulk.enqueue_many([request], ledger=ledger)

    # Then it is queued afresh: it never ran
    assert (again.accepted, again.duplicates, again.expired_ids) == (1, 0, [])


async def test_the_ledger_lives_its_ttl_and_holds_only_what_receivers_took(
    bulk: BulkClient, make_queue: QueueFactory, redis_client: redis.Redis
) -> None:
    # Given a ledgered batch, one request of which a receiver took
    ledger = Ledger("job-3: a long name, as a job's namespace may be " + "x" * 100, ttl_s=600)
    requests = rows("job-3", 2)
    bulk.enqueue_many(requests, ledger=ledger)
    keys = bulk.keys.endpoint(ENDPOINT)
    key = keys.ledger(ledger_token(ledger.name))
    # ...each record naming the ledger by its short token alone
    assert (
        record_fields(redis_client, keys.request(requests[0].id))[b"dd"]
        == ledger_token(ledger.name).encode()
    )
    assert len(ledger_token(ledger.name)) == 8
    taken = make_queue()
    pending = await taken.dequeue(ENDPOINT, timeout_s=5)
    assert pending is not None

    # Then the ledger holds the taken id (and its marker), with the ledger's TTL
    assert redis_client.smembers(key) == {b".", pending.id.encode()}
    assert 590_000 < redis_client.pttl(key) <= 600_000
    # And a request enqueued without a ledger names none and joins none when taken
    plain = Request(endpoint="poll://unledgered", method="m")
    bulk.enqueue_many([plain])
    assert b"dd" not in record_fields(
        redis_client, bulk.keys.endpoint(plain.endpoint).request(plain.id)
    )


async def test_retry_failed_sends_again_what_failed_worth_a_retry_and_nothing_else(
    bulk: BulkClient,
    make_queue: QueueFactory,
    redis_client: redis.Redis,
    redis_url: str,
    key_prefix: str,
) -> None:
    # Given a request whose receiver died holding it (declared lost), one a user cancelled
    # after pickup, and one answered
    lost, cancelled, answered = rows("job-4", 3)
    assert bulk.enqueue_many([lost, cancelled]).accepted == 2
    assert {i.request_id for i in silent_take(redis_client, bulk.keys.prefix, ENDPOINT)} == {
        lost.id,
        cancelled.id,
    }
    node = make_queue()
    assert await node.cancel(cancelled.id)
    fast = QueueSettings(**{**FAST_SETTINGS, "receiver_timeout_s": 0.5})
    with BulkClient.from_url(redis_url, prefix=key_prefix, settings=fast) as reader:
        await async_wait_until(
            lambda: reader.outcomes(ENDPOINT, [lost.id])[lost.id].reason == "receiver_lost",
            10, 0.1, "the receiver declared lost",
        )  # fmt: skip
    make_queue.serve(make_queue(), ENDPOINT, lambda request: request.params)
    assert bulk.enqueue_many([answered]).accepted == 1
    await async_wait_until(
        lambda: bulk.outcomes(ENDPOINT, [answered.id])[answered.id].state == "done",
        10, 0.05, "answered",
    )  # fmt: skip

    # When all three are sent again: plainly, then with retry_failed
    plain = bulk.enqueue_many([lost, cancelled, answered])
    retried = bulk.enqueue_many([lost, cancelled, answered], retry_failed=True)

    # Then a plain resend queues none; retry_failed queues the lost one alone (a cancel is
    # the user's word, an answer is an answer)
    assert (plain.accepted, plain.duplicates) == (0, 3)
    assert (retried.accepted, sorted(retried.duplicate_ids)) == (
        1,
        sorted([cancelled.id, answered.id]),
    )
    await async_wait_until(
        lambda: bulk.outcomes(ENDPOINT, [lost.id])[lost.id].state == "done",
        10, 0.05, "the lost one answered this time",
    )  # fmt: skip


def test_a_loss_watch_tells_lost_records_from_a_read_sent_again(
    own_redis: EmbeddedRedis, own_redis_client: redis.Redis
) -> None:
    # Given a started watch and a request whose outcome it is read with
    with BulkClient.from_url(own_redis.url, settings=QueueSettings(**FAST_SETTINGS)) as bulk:
        watch = LossWatch()
        bulk.start_watch(ENDPOINT, watch)
        request = rows("job-5", 1)[0]
        bulk.enqueue_many([request])
        assert bulk.outcomes(ENDPOINT, [request.id], watch=watch)[request.id].state == "queued"
        # When Redis ran a read whose reply was lost, and the read is sent again
        lost_reply = watch.step_call(bulk.keys.endpoint(ENDPOINT))
        own_redis_client.execute_command(*lost_reply.args)  # type: ignore[no-untyped-call]
        bulk.outcomes(ENDPOINT, [request.id], watch=watch)

        # Then that is no loss
        assert not watch.lost

        # When Redis loses everything, scripts included (the read is sent again after they
        # are loaded: the first sending hit NOSCRIPT)
        own_redis_client.flushall()
        own_redis_client.script_flush()
        found = bulk.outcomes(ENDPOINT, [request.id], watch=watch)

        # Then the record is missing and the watch says it was lost, and stays so
        assert found[request.id].state in ("missing", "unknown")
        assert watch.lost
        bulk.outcomes(ENDPOINT, [request.id], watch=watch)
        assert watch.lost
