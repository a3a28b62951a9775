"""Bulk enqueue of detached requests (prq.bulk) against a real Redis and real receivers."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from prq import QueueSettings, Request, RequestState
from prq.bulk import BulkClient, LossWatch, TaskAttempt, fingerprints
from prq.core.keys import KeySchema
from prq.core.models import encode_stored_request
from prq.protocol.scripts.enqueue import enqueue_many_call, parse_enqueue_many
from tests.queue_facades import FAST_SETTINGS, QueueFactory
from tests.queued import queue_depth, queued_ids, silent_take
from tests.redis_servers import async_wait_until, server_ms, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def bulk(redis_url: str, key_prefix: str) -> Iterator[BulkClient]:
    settings = QueueSettings(**{**FAST_SETTINGS, "pickup_timeout_s": 60})
    with BulkClient.from_url(redis_url, prefix=key_prefix, settings=settings) as client:
        yield client


def rows(endpoint: str, run: str, n: int) -> list[Request]:
    return [
        Request(endpoint=endpoint, method="double", params=i, id=f"{run}:{i}") for i in range(n)
    ]


def test_a_batch_is_enqueued_once_whoever_sends_it_again(
    bulk: BulkClient, redis_client: redis.Redis
) -> None:
    # Given 2,500 requests for two endpoints, sent 1,000 per round trip
    requests = rows("poll://bulk-a", "run1", 1500) + rows("poll://bulk-b", "run1", 1000)
    first = bulk.enqueue_many(requests)
    assert (first.accepted, first.duplicates, first.rejected) == (2500, 0, [])
    keys = bulk.keys
    assert queue_depth(redis_client, keys.endpoint("poll://bulk-a")) == 1500
    assert queue_depth(redis_client, keys.endpoint("poll://bulk-b")) == 1000

    # When the same requests are sent again (a retried Spark task), in other batch sizes
    again = bulk.enqueue_many(requests, batch_size=700)

    # Then nothing is enqueued twice, and every id is reported as a duplicate
    assert (again.accepted, again.duplicates) == (0, 2500)
    assert sorted(again.duplicate_ids) == sorted(r.id for r in requests)
    assert queue_depth(redis_client, keys.endpoint("poll://bulk-a")) == 1500
    assert int(redis_client.get(keys.endpoint("poll://bulk-a").sequence) or 0) == 1500


async def test_a_result_says_how_many_requests_each_endpoint_holds_after_it(
    bulk: BulkClient, make_queue: QueueFactory
) -> None:
    # Given requests at two priorities of one endpoint and one batch for another
    high = [r.model_copy(update={"priority": 5}) for r in rows("poll://depth-a", "hi", 300)]
    result = bulk.enqueue_many(rows("poll://depth-a", "lo", 1200) + high)
    other = bulk.enqueue_many(rows("poll://depth-b", "b", 10))

    # Then each result says the endpoint's depth after its last batch, over all priorities
    assert result.depths == {"poll://depth-a": 1500}
    assert other.depths == {"poll://depth-b": 10}
    assert (bulk.depth("poll://depth-a"), bulk.depth("poll://depth-b")) == (1500, 10)
    assert bulk.depth("poll://depth-none") == 0
    # ...and counts what left since: a duplicate batch reports the depth of now
    receiver = make_queue()
    for _ in range(4):
        assert await receiver.dequeue("poll://depth-b", timeout_s=5) is not None
    assert bulk.enqueue_many(rows("poll://depth-b", "b", 10)).depths == {"poll://depth-b": 6}
    assert bulk.depth("poll://depth-b") == 6


def test_a_replayed_round_trip_reports_what_the_batch_did(
    bulk: BulkClient, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given one batch call, sent twice with the same nonce (its first reply was lost)
    keys = KeySchema(key_prefix).endpoint("poll://bulk-replay")
    items = [(f"r:{i}", Request(endpoint=keys.endpoint, method="m", id=f"r:{i}")) for i in range(5)]
    encoded = [(rid, r.model_dump_json().encode()) for rid, r in items]
    now_ms = int(time.time() * 1000)
    call = enqueue_many_call(keys, "nonce-1", encoded, now_ms, 60_000, 60_000, 60_000)
    bulk._io.execute([call])  # the first run
    replayed = parse_enqueue_many(bulk._io.execute([call])[0], 5)

    # Then the replay counts the batch's own requests as accepted, and enqueued nothing more
    assert (replayed.accepted, replayed.duplicate_ids) == (5, [])
    assert queue_depth(redis_client, keys) == 5
    # And another batch with those ids is told they are duplicates
    other = enqueue_many_call(keys, "nonce-2", encoded, now_ms, 60_000, 60_000, 60_000)
    assert parse_enqueue_many(bulk._io.execute([other])[0], 5).duplicate_ids == [
        rid for rid, _ in items
    ]


def test_too_large_requests_are_rejected_and_the_rest_enqueued(
    redis_url: str, key_prefix: str
) -> None:
    settings = QueueSettings(max_body_bytes=300, inline_limit_bytes=300)
    with BulkClient.from_url(redis_url, prefix=key_prefix, settings=settings) as client:
        small = Request(endpoint="poll://bulk-size", method="m", id="ok")
        large = Request(endpoint="poll://bulk-size", method="m", params="x" * 400, id="big")
        result = client.enqueue_many([small, large])
    assert result.accepted == 1
    assert [(r.request_id, type(r.error).__name__) for r in result.rejected] == [
        ("big", "PayloadTooLarge")
    ]


async def test_detached_requests_run_to_the_end_and_keep_their_responses(
    bulk: BulkClient, make_queue: QueueFactory
) -> None:
    # Given detached requests, and a receiver whose sender-silence limit is short
    endpoint = "poll://bulk-served"
    requests = rows(endpoint, f"run-{uuid.uuid4().hex[:6]}", 30)
    assert bulk.enqueue_many(requests).accepted == 30
    timings: dict[str, Any] = {"sender_timeout_s": 0.6, "heartbeat_interval_s": 0.1,
               "heartbeat_initial_delay_s": 0.1}  # fmt: skip
    receiver = make_queue(**timings)

    async def slow_double(request: Request) -> object:
        if request.params == 0:
            await asyncio.sleep(1.5)  # the work: longer than the sender-silence limit
        return {"doubled": request.params * 2}  # type: ignore[operator]

    make_queue.serve(receiver, endpoint, slow_double, concurrency=4)

    # Then every request is answered (nobody cancels a detached request for its sender's
    # silence), and the responses are kept under their ids
    ids = [r.id for r in requests]

    def all_done() -> bool:
        return all(s.state == "done" for s in bulk.outcomes(endpoint, ids).values())

    await async_wait_until(all_done, 20.0, 0.1, "every detached request answered")
    outcomes = bulk.outcomes(endpoint, ids)
    assert b'"doubled":0' in outcomes[ids[0]].response.replace(b" ", b"")
    assert b'"doubled":58' in outcomes[ids[29]].response.replace(b" ", b"")
    # And any node can ask by id alone (the locator was written)
    status = await receiver.status(ids[5])
    assert status.state == RequestState.DONE and status.endpoint == endpoint


async def test_a_lost_receiver_is_reported_and_cancelled_ids_can_be_sent_again(
    make_queue: QueueFactory, redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    settings = QueueSettings(
        **FAST_SETTINGS,
        receiver_timeout_s=1.0,
        heartbeat_interval_s=0.2,
        heartbeat_initial_delay_s=0.1,
    )
    bulk = BulkClient.from_url(redis_url, prefix=key_prefix, settings=settings)
    try:
        await _lost_receiver_then_resend(bulk, make_queue, redis_client)
    finally:
        bulk.close()


async def _lost_receiver_then_resend(
    bulk: BulkClient, make_queue: QueueFactory, redis_client: redis.Redis
) -> None:
    endpoint = "poll://bulk-lost"
    taken_req, queued_req = rows(endpoint, "lost", 2)
    assert bulk.enqueue_many([taken_req]).accepted == 1
    timings: dict[str, Any] = {"receiver_timeout_s": 1.0, "heartbeat_interval_s": 0.2,
               "heartbeat_initial_delay_s": 0.1}  # fmt: skip
    other = make_queue(**timings)
    # a receiver takes it and dies holding it (no heartbeats, no answer; a queue closed
    # gracefully would give it back instead)
    held = silent_take(redis_client, bulk.keys.prefix, endpoint)
    assert [i.request_id for i in held] == [taken_req.id]
    assert bulk.enqueue_many([queued_req]).accepted == 1

    # Then reading the outcome, after the receiver timeout, declares it lost
    def lost() -> bool:
        return bulk.outcomes(endpoint, [taken_req.id])[taken_req.id].reason == "receiver_lost"

    await async_wait_until(lost, 10.0, 0.1, "receiver declared lost")

    # And a request cancelled before pickup (by id, from any node) may be sent again
    assert await other.cancel(queued_req.id) is True
    again = bulk.enqueue_many([queued_req, taken_req])
    assert again.accepted == 1 and again.duplicate_ids == [taken_req.id]


async def test_requests_without_locators_are_found_by_id_through_the_registry(
    bulk: BulkClient, make_queue: QueueFactory, redis_client: redis.Redis
) -> None:
    # Given requests enqueued encoded and without locators, for two endpoints, and garbage in
    # the endpoint registry (a name that does not decode, one that is not a valid endpoint)
    redis_client.zadd(bulk.keys.endpoints, {"%ZZ-not-encoded": 1, "%0A": 2})
    items = {}
    for endpoint in ("poll://quiet-a", "poll://quiet-b"):
        requests = rows(endpoint, f"noloc-{endpoint[-1]}", 3)
        items[endpoint] = [r.id for r in requests]
        encoded = [(r.id, r.model_dump_json()) for r in requests]
        done = bulk.enqueue_encoded(endpoint, encoded, locators=False)
        assert (done.accepted, done.duplicates) == (3, 0)
    assert not list(redis_client.scan_iter(bulk.keys.locator("*"), count=1000))
    registered = redis_client.zrange(bulk.keys.endpoints, 0, -1)
    assert b"poll%3A%2F%2Fquiet-a" in registered and b"poll%3A%2F%2Fquiet-b" in registered

    # When a node asks by id alone
    node = make_queue()
    first_b = items["poll://quiet-b"][0]
    status = await node.status(first_b)

    # Then the registry's endpoints are asked and the right one answers
    assert status.state == RequestState.QUEUED and status.endpoint == "poll://quiet-b"
    assert await node.cancel(first_b) is True
    assert (await node.status(first_b)).state == RequestState.WITHDRAWN
    assert queue_depth(redis_client, bulk.keys.endpoint("poll://quiet-b")) == 2
    # And an id nobody holds is unknown, not an error
    assert (await node.status("noloc-none:1")).state == RequestState.UNKNOWN
    assert await node.cancel("noloc-none:1") is False


def test_a_request_nobody_took_by_its_pickup_deadline_reads_as_a_pickup_timeout(
    bulk: BulkClient, redis_client: redis.Redis
) -> None:
    # Given detached requests with a short pickup deadline, and no receiver
    endpoint = "poll://bulk-unserved"
    requests = rows(endpoint, "unserved", 3)
    assert bulk.enqueue_many(requests[:2], pickup_timeout_s=0.2).accepted == 2
    assert bulk.enqueue_many(requests[2:], pickup_timeout_s=60).accepted == 1
    ids = [r.id for r in requests]
    pending = bulk.keys.endpoint(endpoint)

    # When their outcomes are read after the deadline passed
    def overdue_withdrawn() -> bool:
        states = bulk.outcomes(endpoint, ids)
        return all(states[i].state == "withdrawn" for i in ids[:2])

    wait_until(overdue_withdrawn, 5.0, 0.05, "overdue requests withdrawn")

    # Then they are withdrawn for the pickup timeout, gone from the queue, and may be sent again;
    # the request whose deadline is ahead stays queued
    outcomes = bulk.outcomes(endpoint, ids)
    assert {outcomes[i].reason for i in ids[:2]} == {"pickup_timeout"}
    assert outcomes[ids[2]].state == "queued"
    assert queued_ids(redis_client, pending) == [ids[2].encode()]
    again = bulk.enqueue_many(requests, pickup_timeout_s=60)
    assert (again.accepted, again.duplicate_ids) == (2, [ids[2]])


def test_outcomes_of_a_wide_window_are_read_in_a_few_script_calls_each_judged_alone(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    settings = QueueSettings(**{**FAST_SETTINGS, "receiver_timeout_s": 0.5, "pickup_timeout_s": 60})
    endpoint = "poll://bulk-wide"
    with BulkClient.from_url(redis_url, prefix=key_prefix, settings=settings) as bulk:
        # Given requests taken by a receiver that died holding them (two at_most_once, two
        # at_least_once), then 300 queued ones, and ids nothing is stored under
        lost = rows(endpoint, "wide-lost", 2)
        leased = [
            r.model_copy(update={"delivery": "at_least_once"})
            for r in rows(endpoint, "wide-leased", 2)
        ]
        assert bulk.enqueue_many(lost + leased).accepted == 4
        held = silent_take(redis_client, bulk.keys.prefix, endpoint, want=4)
        assert len(held) == 4
        queued = rows(endpoint, "wide-queued", 300)
        assert bulk.enqueue_many(queued).accepted == 300
        missing = [f"wide-missing:{i}" for i in range(3)]
        ids = [r.id for r in lost + leased + queued] + missing
        watch = LossWatch()
        bulk.start_watch(endpoint, watch)

        # When the window's outcomes are read once the receiver timeout has passed (by the
        # server's clock, which judges it)
        judged_from = server_ms(redis_client) + int(settings.receiver_timeout_s * 1000) + 50
        wait_until(
            lambda: server_ms(redis_client) > judged_from, 5.0, 0.05, "receiver timeout passed"
        )
        commands, round_trips = bulk._io.commands, bulk._io.round_trips
        found = bulk.outcomes(endpoint, ids, watch=watch)

        # Then one round trip read them all: a script call per 256 ids and the watch
        assert (bulk._io.commands - commands, bulk._io.round_trips - round_trips) == (3, 1)
        assert list(found) == ids
        # And each was judged alone: the lost receiver's at_most_once requests are cancelled,
        # its at_least_once ones queued again, the rest as they stand
        assert {(found[r.id].state, found[r.id].reason) for r in lost} == {
            ("cancelled", "receiver_lost")
        }
        assert all(found[r.id].state == "queued" and found[r.id].redelivered for r in leased)
        assert all(found[r.id].state == "queued" for r in queued)
        assert all(found[i].state == "missing" for i in missing)
        assert not watch.lost


def stored(endpoint: str, run: str, n: int, params: int) -> list[tuple[str, bytes]]:
    """(id, stored body) of n requests whose params are `params` plus their place."""
    return [
        (
            f"{run}:{i}",
            encode_stored_request(Request(endpoint=endpoint, method="m", params=params + i)),
        )
        for i in range(n)
    ]


def marks(items: list[tuple[str, bytes]]) -> list[bytes]:
    return fingerprints(body for _, body in items)


# (3: each record spelled by the script; 10: the batch sent whole, with a shared head)
@pytest.mark.parametrize("n", [3, 10])
async def test_a_known_id_sent_with_another_fingerprint_is_a_conflict_not_a_duplicate(
    bulk: BulkClient, make_queue: QueueFactory, n: int
) -> None:
    # Given requests enqueued with fingerprints of their params, answered since
    endpoint = "poll://bulk-fingerprints"
    first = stored(endpoint, "job", n, 0)
    ids = [rid for rid, _ in first]
    sent = bulk.enqueue_encoded(endpoint, first, fingerprints=marks(first))
    assert (sent.accepted, sent.duplicates) == (n, 0)
    # ...each before and after it was answered (its record then in the hash form)
    for answered in (False, True):
        if answered:
            make_queue.serve(make_queue(), endpoint, lambda request: request.params)
            await async_wait_until(
                lambda: {s.state for s in bulk.outcomes(endpoint, ids).values()} == {"done"},
                20, 0.02, "answered",
            )  # fmt: skip

        # When the same ids are sent again by another batch: with the same params, with other
        # params, and with other params but no fingerprints
        same = bulk.enqueue_encoded(endpoint, first, fingerprints=marks(first))
        other = stored(endpoint, "job", n, 100)
        changed = bulk.enqueue_encoded(endpoint, other, fingerprints=marks(other))
        unmarked = bulk.enqueue_encoded(endpoint, other)

        # Then the same request is a duplicate (it joins the one enqueued), another one under
        # the id a conflict (among the duplicates: nothing is enqueued), and without
        # fingerprints nothing tells them apart
        assert (same.accepted, same.duplicate_ids, same.conflict_ids) == (0, ids, [])
        assert (changed.accepted, changed.duplicate_ids, changed.conflict_ids) == (0, ids, ids)
        assert (unmarked.duplicate_ids, unmarked.conflict_ids) == (ids, [])
    assert bulk.depth(endpoint) == 0

    # And the attempts of one task: a later attempt with the same rows is accepted (its work
    # counts), one with other rows under those ids is a conflict
    task, rows_a = TaskAttempt("task-1"), stored(endpoint, "task", n, 0)
    assert (
        bulk.enqueue_encoded(endpoint, rows_a, attempt=task, fingerprints=marks(rows_a)).accepted
        == n
    )
    retry = TaskAttempt("task-1")
    assert (
        bulk.enqueue_encoded(endpoint, rows_a, attempt=retry, fingerprints=marks(rows_a)).accepted
        == n
    )
    rows_b = stored(endpoint, "task", n, 50)
    late = bulk.enqueue_encoded(
        endpoint, rows_b, attempt=TaskAttempt("task-1"), fingerprints=marks(rows_b)
    )
    assert (late.accepted, late.conflict_ids) == (0, [rid for rid, _ in rows_b])
    # And a fingerprint per item is required
    with pytest.raises(ValueError, match="fingerprints for"):
        bulk.enqueue_encoded(endpoint, rows_a, fingerprints=marks(rows_a)[1:])


def test_a_loss_watch_on_an_enqueue_is_stepped_beside_the_endpoints_records(
    bulk: BulkClient, redis_client: redis.Redis
) -> None:
    # Given a job that enqueues to two endpoints with one watch, in three round trips (on a
    # cluster, the watch lives in the first endpoint's slot, beside its records)
    watch = LossWatch()
    requests = rows("poll://watched-a", "lw", 150) + rows("poll://watched-b", "lw", 50)
    result = bulk.enqueue_many(requests, batch_size=100, watch=watch)
    assert (result.accepted, result.data_loss) == (200, False)
    keys = bulk.keys.endpoint("poll://watched-a")
    assert watch.endpoint == "poll://watched-a"
    assert int(redis_client.get(keys.loss_watch(watch.token)) or 0) == watch.count
    # And a later call with it steps the same key, whatever endpoint it writes first
    again = bulk.enqueue_many(rows("poll://watched-b", "lw2", 10), watch=watch)
    assert (again.accepted, again.data_loss) == (10, False)

    # When the watch's key is lost (as a flush or a restart would lose it)
    redis_client.delete(keys.loss_watch(watch.token))

    # Then the next enqueue with it says Redis lost data
    lost = bulk.enqueue_many(rows("poll://watched-a", "lw3", 10), watch=watch)
    assert (lost.accepted, lost.data_loss) == (10, True)
