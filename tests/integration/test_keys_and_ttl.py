"""What Redis keeps: every key has a TTL and all of them go; oversized bodies write nothing."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest
import redis
from pydantic import JsonValue

from prq import (
    CancelledBeforePickup,
    PayloadTooLarge,
    PickupTimeout,
    QueueSettings,
    RedisSettings,
    Request,
    RequestState,
)
from prq.bulk import BulkClient
from prq.core.keys import encode_endpoint
from prq.core.models import encode_stored_request
from tests.queue_facades import QueueFactory, run_all, wait_for_state
from tests.redis_servers import async_wait_until, request_keys, scan_keys
from tests.stored_bodies import body_field_names, read_body, record_fields

pytestmark = pytest.mark.integration

#: Tiny TTLs, so that a test can watch every key expire. With them the longest-lived key would
#: be a locator (with request_locators): request TTL (pickup 2 s + extra 1 s) + in-flight TTL
#: (max(response 1 s, receiver timeout 1 s + extra 1 s) = 2 s) + response TTL 1 s = 6 s.
TINY_TTLS: dict[str, Any] = {
    "response_ttl_s": 1.0,
    "request_ttl_extra_s": 1.0,
    "list_ttl_s": 2.0,
    "cancel_marker_ttl_s": 1.0,
    "receiver_timeout_s": 1.0,
    "heartbeat_initial_delay_s": 0.3,
    "heartbeat_interval_s": 0.5,
    "pickup_timeout_s": 0.5,
    # (below half the list TTL: a node's next check comes while it vouches for the counters)
    "data_loss_check_interval_s": 0.5,
    "retry_budget_s": 2.0,
}
#: Short connection timeouts: a take receipt, which outlives a failed take and the serve loop's
#: next one, lives retry budget 2 s + socket timeout 1 s + 1 s + the serve loop's longest pause
#: 5 s + connect and socket timeouts 2 s + 1 s = 12 s (QueueSettings.receipt_ttl_s).
QUICK_LINK: dict[str, Any] = {"socket_timeout_s": 1.0, "connect_timeout_s": 1.0}
#: A node's canary lives 3 check intervals + the retry budget + 1 s = 4.5 s while the node runs.
#: No key may live longer than a take receipt under TINY_TTLS (then the 6 s locator), plus margin.
LONGEST_TTL_MS = 13_000
#: How long the test waits for every key to be gone (Redis expires keys actively within ~1 s).
ALL_EXPIRED_WITHIN_S = 20.0
#: What a queued at_most_once request's record may hold besides its body: state, creation
#: time, pickup deadline, priority, sequence, and the sender (a call) or batch nonce and one-way
#: mark (bulk, notify). Attempts, owner, receiver and pickup time are written at pickup.
QUEUED_FIELDS = {b"st", b"ct", b"pd", b"pri", b"sq", b"snd", b"bn", b"ow"}
#: Body limit in the payload tests.
MAX_BODY_BYTES = 1024


async def test_every_key_has_a_ttl_and_none_remain_after_the_ttls_pass(
    make_queue: QueueFactory,
    redis_url: str,
    redis_client: redis.Redis,
    key_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given tiny TTLs (a take receipt lives 12 s here, the longest)
    link = RedisSettings(url=redis_url, **QUICK_LINK)
    assert QueueSettings(**TINY_TTLS).receipt_ttl_s(link) * 1000 < LONGEST_TTL_MS
    sender = make_queue(redis_settings=link, **TINY_TTLS)
    receiver = make_queue(redis_settings=link, **TINY_TTLS)
    served, unserved = "poll://ttl-served", "poll://ttl-unserved"
    serving = make_queue.serve(receiver, served, lambda request: request.params, concurrency=2)

    # When traffic runs: completed calls, a pickup timeout, a cancel before pickup, and a bulk
    # batch sent whole (its records and its shared head)
    results = await run_all((sender.call(served, "m", i) for i in range(5)), 10)
    assert results == list(range(5))
    with pytest.raises(PickupTimeout):
        await asyncio.wait_for(sender.call(unserved, "m"), 10)
    request = Request(endpoint=unserved, method="m")
    call = asyncio.create_task(sender.queue_and_wait(request, pickup_timeout_s=2.0))
    await wait_for_state(sender, request.id, RequestState.QUEUED)
    assert await sender.cancel(request.id)
    with pytest.raises(CancelledBeforePickup):
        await asyncio.wait_for(call, 10)
    await serving.stop()
    bulked = [Request(endpoint=unserved, method="m", id=f"bulk-{i}") for i in range(10)]
    with BulkClient.from_url(
        redis_url, prefix=key_prefix, settings=QueueSettings(**TINY_TTLS)
    ) as bulk:
        assert bulk.enqueue_many(bulked).accepted == 10

    # Then every key of the prefix has a TTL, and a short one
    keys = scan_keys(redis_client, key_prefix)
    tombstone = sender.keys.endpoint(unserved).request(request.id).encode()
    assert tombstone in keys, "the scan must see the traffic"
    assert any(b"}:bh:" in key for key in keys), "the scan must see the bulk batch's head"
    ttls = {key: redis_client.pttl(key) for key in keys}
    ttls = {key: ttl for key, ttl in ttls.items() if ttl != -2}  # -2: expired meanwhile
    assert [key for key, ttl in ttls.items() if ttl == -1] == [], "keys without a TTL"
    assert {k: t for k, t in ttls.items() if t > LONGEST_TTL_MS} == {}, "keys living too long"
    # And once the nodes stop and the TTLs pass, no key of the prefix remains
    await sender.aclose()
    await receiver.aclose()
    await async_wait_until(
        lambda: not scan_keys(redis_client, key_prefix),
        ALL_EXPIRED_WITHIN_S,
        0.2,
        "every key of the prefix expired",
    )


@pytest.mark.parametrize("locators", [False, True])
async def test_a_queued_request_is_one_record_and_a_locator_only_when_asked_for(
    make_queue: QueueFactory,
    redis_url: str,
    redis_client: redis.Redis,
    key_prefix: str,
    locators: bool,
) -> None:
    # Given requests queued by every way of sending, with nobody serving the endpoint
    endpoint = "poll://one-record"
    sender = make_queue(request_locators=locators, pickup_timeout_s=30)
    payload: JsonValue = {"data": "x" * 90}  # (a body over 64 bytes: it is kept in pieces)
    called = Request(endpoint=endpoint, method="call", params=payload)
    call = asyncio.create_task(sender.queue_and_wait(called))
    await wait_for_state(sender, called.id, RequestState.QUEUED)
    sent = Request(endpoint=endpoint, method="send", params=payload)
    handle = await sender.send(sent, on_response=lambda _r: None, on_failure=lambda _e: None)
    notified = await sender.notify(endpoint, "notify", payload)
    settings = QueueSettings(request_locators=locators)
    with BulkClient.from_url(redis_url, prefix=key_prefix, settings=settings) as bulk:
        bulked = Request(endpoint=endpoint, method="bulk", params=payload, id="bulk-1")
        assert bulk.enqueue_many([bulked]).accepted == 1
    ids = [called.id, sent.id, notified, bulked.id]

    # Then each leaves one key of its own, its record, with a TTL (and its locator if asked)
    keys = sender.keys
    for request_id in ids:
        own = sorted(k for k in scan_keys(redis_client, key_prefix) if request_id.encode() in k)
        expected = [keys.endpoint(endpoint).request(request_id).encode()]
        if locators:
            expected = sorted([*expected, keys.locator(request_id).encode()])
        assert own == expected, request_id
        assert all(redis_client.pttl(key) > 0 for key in own)
        # ...holding only what the queued state needs (what pickup adds is written then)
        record = keys.endpoint(endpoint).request(request_id)
        fields = set(record_fields(redis_client, record))
        fields -= body_field_names(fields)
        assert fields <= QUEUED_FIELDS, (request_id, fields - QUEUED_FIELDS)
        # ...in Redis's compact encoding (a hash's body over 64 bytes is kept in pieces:
        # prq.core.records; a bulk or notify request is one string until its pickup), its body
        # saying nothing the key says (the id, the endpoint)
        body = read_body(redis_client, record) or b""
        assert len(body) > 64 and request_id.encode() not in body, body
        assert encode_endpoint(endpoint).encode() not in body and endpoint.encode() not in body
        compact = b"raw" if request_id in (bulked.id, notified) else b"listpack"
        assert redis_client.object("encoding", record) == compact, request_id
    # And any other node finds each by id alone
    other = make_queue()
    for request_id in ids:
        status = await other.status(request_id)
        assert (status.state, status.endpoint) == (RequestState.QUEUED, endpoint), request_id
    assert await other.cancel(called.id)
    with pytest.raises(CancelledBeforePickup):
        await asyncio.wait_for(call, 10)
    assert await handle.withdraw()


def body_bytes(request: Request) -> int:
    """Size of a request's stored body, encoded as prq encodes it."""
    return len(encode_stored_request(request))


def request_of_size(endpoint: str, producer: str, size: int) -> Request:
    """A request whose stored body is exactly `size` bytes (ASCII params, so 1 char = 1 byte)."""
    empty = Request(endpoint=endpoint, method="m", params="", producer=producer, id="sized-1")
    request = empty.model_copy(update={"params": "x" * (size - body_bytes(empty))})
    assert body_bytes(request) == size
    return request


async def test_a_body_over_max_body_bytes_is_refused_before_anything_is_written(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given a sender with max_body_bytes=1024 and a request whose body is one byte more
    limits: dict[str, Any] = {
        "max_body_bytes": MAX_BODY_BYTES,
        "inline_limit_bytes": MAX_BODY_BYTES,
    }
    sender = make_queue(**limits)
    await sender.start()
    endpoint = "poll://sized"
    too_large = request_of_size(endpoint, sender.node_id, MAX_BODY_BYTES + 1)
    before = request_keys(redis_client, key_prefix)

    # When it is sent
    with pytest.raises(PayloadTooLarge) as raised:
        await asyncio.wait_for(sender.queue_and_wait(too_large), 10)

    # Then it is refused with its size and the limit, and nothing was written
    assert (raised.value.size_bytes, raised.value.limit_bytes) == (MAX_BODY_BYTES + 1, 1024)
    assert isinstance(raised.value, ValueError) and not raised.value.maybe_executed
    assert request_keys(redis_client, key_prefix) == before
    assert (await sender.status(too_large.id)).state == RequestState.UNKNOWN


async def test_a_body_at_max_body_bytes_goes_through(make_queue: QueueFactory) -> None:
    # Given a sender and a receiver with max_body_bytes=1024, and a body of exactly 1024 bytes
    limits: dict[str, Any] = {
        "max_body_bytes": MAX_BODY_BYTES,
        "inline_limit_bytes": MAX_BODY_BYTES,
    }
    sender, receiver = make_queue(**limits), make_queue(**limits)
    make_queue.serve(receiver, "poll://sized", lambda request: len(str(request.params)))
    at_limit = request_of_size("poll://sized", sender.node_id, MAX_BODY_BYTES)

    # When it is sent
    response = await asyncio.wait_for(sender.queue_and_wait(at_limit), 10)

    # Then it is served
    assert response.error is None and response.result == len(str(at_limit.params))


async def test_a_request_from_a_process_that_exited_at_once_is_found_by_id(
    make_queue: QueueFactory, redis_url: str, key_prefix: str
) -> None:
    # Given a process that sends one message and exits at once (before any presence report)
    endpoint = "poll://short-lived-sender"
    script = (
        "import sys\n"
        "from prq import Queue\n"
        "with Queue.from_url(sys.argv[1], prefix=sys.argv[2]) as queue:\n"
        "    print(queue.notify(sys.argv[3], 'm'))\n"
    )
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", script, redis_url, key_prefix, endpoint],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    request_id = done.stdout.strip()
    # When another node asks for it by id alone
    status = await make_queue().status(request_id)
    # Then it is found, queued, on its endpoint (its first enqueue registered the endpoint)
    assert (status.state, status.endpoint) == (RequestState.QUEUED, endpoint)
