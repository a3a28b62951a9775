"""`prq limits` and `prq dead-letters` as real processes against a real Redis."""

from __future__ import annotations

import json

import pytest
import redis

from prq import QueueSettings, RedisSettings, Request
from prq.core.keys import KeySchema, encode_endpoint
from prq.facade.blocking_queue import Queue
from prq.protocol.dead import dead_letter_call
from tests.integration.test_cli import PrqRunner
from tests.queued import queue_depth

pytestmark = pytest.mark.integration

ENDPOINT = "poll://managed"


def test_limits_are_printed_changed_one_at_a_time_and_cleared(
    prq: PrqRunner, redis_client: redis.Redis, key_prefix: str
) -> None:
    def limits(*args: str) -> dict[str, object]:
        done = prq.run("limits", ENDPOINT, *args)
        assert done.returncode == 0, done.stderr
        found: dict[str, object] = json.loads(done.stdout)
        return found

    assert limits() == {"endpoint": ENDPOINT, "max_in_flight": None, "max_pending": None}
    assert limits("--max-in-flight", "8", "--max-pending", "100")["max_pending"] == 100
    # a limit not named keeps its value; none removes one
    assert limits("--max-pending", "none") == {
        "endpoint": ENDPOINT, "max_in_flight": 8, "max_pending": None,
    }  # fmt: skip
    assert redis_client.hgetall(KeySchema(key_prefix).endpoint(ENDPOINT).limits) == {b"mif": b"8"}
    assert limits("--clear") == {"endpoint": ENDPOINT, "max_in_flight": None, "max_pending": None}
    # nonsense is a usage error, and changes nothing
    for bad in (
        ["--max-in-flight", "0"],
        ["--max-pending", "lots"],
        ["--clear", "--max-pending", "3"],
    ):
        assert prq.run("limits", ENDPOINT, *bad).returncode == 2, bad
    assert prq.run("limits", "poll://bad\nname").returncode == 2
    assert not redis_client.exists(KeySchema(key_prefix).endpoint(ENDPOINT).limits)


def test_dead_letters_are_listed_replayed_once_and_purged(
    prq: PrqRunner, redis_client: redis.Redis, redis_url: str, key_prefix: str
) -> None:
    # Given three dead letters
    requests = [Request(endpoint=ENDPOINT, method="m", params=i) for i in range(3)]
    settings = QueueSettings(retry_budget_s=5)
    with Queue(RedisSettings.from_url(redis_url), prefix=key_prefix, settings=settings) as node:
        node.start()
        for request in requests:
            call = dead_letter_call(
                node.ctx, ENDPOINT, request.id, request.model_dump_json().encode(), "test", 2
            )
            redis_client.execute_command(*call.args)  # type: ignore[no-untyped-call]

    # Then they are listed newest first, one JSON line each
    listed = prq.run("dead-letters", ENDPOINT)
    assert listed.returncode == 0, listed.stderr
    lines = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [d["id"] for d in lines] == [r.id for r in reversed(requests)]
    assert {(d["reason"], d["attempts"]) for d in lines} == {("test", 2)}
    # And a replay queues one request once
    replayed = prq.run(
        "dead-letters", ENDPOINT, "--replay", requests[0].id, "--replay", requests[0].id
    )
    assert [json.loads(line)["outcome"] for line in replayed.stdout.splitlines()] == [
        "replayed", "missing",
    ]  # fmt: skip
    assert queue_depth(redis_client, KeySchema(key_prefix).endpoint(ENDPOINT)) == 1
    # And purges drop the named one, then all
    purged = prq.run("dead-letters", ENDPOINT, "--purge", requests[1].id)
    assert json.loads(purged.stdout) == {"purged": 1}
    assert json.loads(prq.run("dead-letters", ENDPOINT, "--purge-all").stdout) == {"purged": 1}
    assert prq.run("dead-letters", ENDPOINT).stdout == ""
    # And two actions at once are a usage error
    both = prq.run("dead-letters", ENDPOINT, "--purge-all", "--replay", requests[0].id)
    assert both.returncode == 2


def test_endpoints_forget_removes_an_idle_endpoint_and_refuses_a_busy_one_unless_forced(
    prq: PrqRunner, redis_client: redis.Redis, key_prefix: str, redis_url: str
) -> None:
    registry = KeySchema(key_prefix).endpoints
    typo, busy = "poll://biling-7", "poll://forget-busy"
    redis_client.zadd(registry, {encode_endpoint(typo): 1})

    # An idle endpoint is forgotten (exit 0, what was found as JSON)
    done = prq.run("endpoints", "forget", typo)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["forgotten"] is True
    assert redis_client.zscore(registry, encode_endpoint(typo)) is None
    # Forgetting it again: not listed, exit 1 with a message
    again = prq.run("endpoints", "forget", typo)
    assert again.returncode == 1 and "not listed" in again.stderr

    # One with a queued request is refused (exit 1, nothing changed), then forced; the request
    # stays queued
    with Queue(RedisSettings(url=redis_url), prefix=key_prefix) as sender:
        sender.notify(busy, "m")
    refused = prq.run("endpoints", "forget", busy)
    assert refused.returncode == 1 and "1 queued" in refused.stderr and "--force" in refused.stderr
    assert redis_client.zscore(registry, encode_endpoint(busy)) is not None
    forced = prq.run("endpoints", "forget", busy, "--force")
    assert forced.returncode == 0, forced.stderr
    assert json.loads(forced.stdout)["depth"] == 1
    assert queue_depth(redis_client, KeySchema(key_prefix).endpoint(busy)) == 1
    # A name nobody may use is a usage error
    assert prq.run("endpoints", "forget", "bad\nname").returncode == 2
