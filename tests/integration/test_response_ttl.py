"""A request may ask how long its answer is kept (Request.response_ttl_s): the receiver keeps it
that long, up to its max_response_ttl_s, on real Redis, both facades; the answer's signature
and the data it keeps beside Redis last as long as the answer, or as long as an answer a caller
waits for is kept at least (QueueSettings.waited_response_ttl_s) when that is longer
(tests/integration/test_short_response_ttl.py: the answers callers wait for).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import redis
from pydantic import SecretStr

from prq import Request, SignatureError
from prq.bulk import BulkClient
from prq.core.bodies import is_spilled, parse
from prq.datastreams import FileSystemStore
from prq.protocol.scripts.replies import RequestSnapshot
from prq.protocol.signing import Signer
from tests.queue_facades import QueueFactory
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration

ENDPOINT = "poll://answer-lifetime"
#: The receiver's own lifetime of an answer, and its bound on what a request may ask.
OWN_S, BOUND_S = 60.0, 600.0
KEY = "lifetime-signing-key-" + "s" * 20


def bulk_client(make_queue: QueueFactory, **overrides: Any) -> BulkClient:
    settings = make_queue.settings(**overrides)
    return BulkClient.from_url(make_queue.url, prefix=make_queue.prefix, settings=settings)


async def answered(bulk: BulkClient, ids: list[str]) -> dict[str, RequestSnapshot]:
    """The snapshots of `ids` once every one is done (bounded)."""
    found: dict[str, RequestSnapshot] = {}

    def done() -> bool:
        found.update(bulk.outcomes(ENDPOINT, ids))
        return all(found[rid].state == "done" for rid in ids)

    await async_wait_until(done, 20, 0.02, "every request answered")
    return found


async def test_the_answer_is_kept_as_long_as_the_request_asked_within_the_receivers_bound(
    make_queue: QueueFactory, redis_client: redis.Redis, tmp_path: Path
) -> None:
    # Given a receiver that keeps answers 60 s and lets a request ask for up to 600 s, and
    # answers over 4 KiB kept beside Redis
    store = FileSystemStore(tmp_path / "store")
    limits: dict[str, Any] = {
        "response_ttl_s": OWN_S, "max_response_ttl_s": BOUND_S, "inline_limit_bytes": 4096,
    }  # fmt: skip
    receiver = make_queue(datastreams=store, **limits)
    make_queue.serve(receiver, ENDPOINT, lambda request: "x" * request.params, concurrency=4)
    # When detached requests ask for nothing, for less, for more within the bound and for more
    # than the bound, each with a small and a large answer
    asks = {"none": None, "short": 5.0, "long": 300.0, "over": 86_400.0}
    requests = [
        Request(endpoint=ENDPOINT, method="m", id=f"{name}-{size}", params=size,
                response_ttl_s=asked)
        for name, asked in asks.items()
        for size in (10, 10_000)
    ]  # fmt: skip
    with bulk_client(make_queue) as bulk:
        assert bulk.enqueue_many(requests).accepted == len(requests)
        snapshots = await answered(bulk, [r.id for r in requests])
    # Then each answer is kept what was asked, the receiver's own when nothing was, the bound
    # when more was asked
    keeps = {"none": OWN_S, "short": 5.0, "long": 300.0, "over": BOUND_S}
    keys = receiver.keys.endpoint(ENDPOINT)
    now_ms = time.time() * 1000
    for request in requests:
        name, size = request.id.split("-")
        kept_ms = keeps[name] * 1000
        ttl_ms = redis_client.pttl(keys.request(request.id))
        assert kept_ms - 20_000 < ttl_ms <= kept_ms, (request.id, ttl_ms)
        # ...and a large answer's body, kept beside Redis, expires with it (or when an answer
        # a caller waits for would, if that is later: the receiver does not know who waits)
        data = snapshots[request.id].response
        assert is_spilled(data) == (size == "10000"), request.id
        if is_spilled(data):
            expires_ms = int(parse(data).reference.split("-")[0])
            lasts_ms = max(kept_ms, receiver.settings.waited_response_ttl_s() * 1000)
            assert kept_ms - 20_000 < expires_ms - now_ms <= lasts_ms + 1_000, request.id


async def test_a_signed_answer_verifies_for_as_long_as_the_request_asked(
    make_queue: QueueFactory,
) -> None:
    # Given a receiver that signs, keeping answers 1 s of its own (7 s when a caller waits:
    # waited_response_ttl_s)
    receiver = make_queue(signing_key=SecretStr(KEY), response_ttl_s=1.0)
    make_queue.serve(receiver, ENDPOINT, lambda request: request.params)
    # When one request asks for its answer to be kept 600 s and another asks nothing
    asked = Request(endpoint=ENDPOINT, method="m", params=1, response_ttl_s=600)
    plain = Request(endpoint=ENDPOINT, method="m", params=2)
    with bulk_client(make_queue, signing_key=SecretStr(KEY)) as bulk:
        bulk.enqueue_many([asked, plain])
        snapshots = await answered(bulk, [asked.id, plain.id])
        # Then a reader 150 s later (past the 60 s of clock skew allowed) still verifies the
        # answer kept 600 s...
        reader = Signer.from_settings(bulk.settings)
        assert reader is not None
        later_ms = int(time.time() * 1000) + 150_000
        opened = reader.open("response", asked.id, ENDPOINT, snapshots[asked.id].response,
                             now_ms=later_ms)  # fmt: skip
        assert b'"result":1' in opened
        # ...and the one kept 1 s was signed to expire with it (or with the 7 s)
        with pytest.raises(SignatureError, match="expired"):
            reader.open("response", plain.id, ENDPOINT, snapshots[plain.id].response,
                        now_ms=later_ms)  # fmt: skip
        # (read now, both verify)
        assert bulk.resolve(snapshots[plain.id], plain.id, ENDPOINT).result == 2  # type: ignore[union-attr]
