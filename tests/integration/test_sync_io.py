"""The blocking batcher (SyncRedisIO): a step sent while a batch is in flight waits for it and
goes in the batch after, unless it is an express step (a receiver's take that does not park),
which goes beside the batch on a connection of its own. A thread handed the lead after its own
step waited past its bound gives that step up and sends nothing for the steps behind it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from prq.core.config import QueueSettings, RedisSettings
from prq.core.errors import PrqError, QueueShutdown, QueueUnavailable
from prq.embedded import EmbeddedRedis
from prq.protocol.effects import Call, Reply
from prq.transport.budgets import STEP_GRACE_S
from prq.transport.sync_io import SyncRedisIO
from tests.redis_servers import wait_until

pytestmark = pytest.mark.integration

#: How long the batch in flight waits in BLPOP (the test releases it long before).
BLOCK_S = 10


@pytest.fixture
def io(own_redis: EmbeddedRedis) -> Iterator[SyncRedisIO]:
    batcher = SyncRedisIO(RedisSettings(url=own_redis.url, socket_timeout_s=20), QueueSettings())
    try:
        yield batcher
    finally:
        batcher.close()


class Batch(threading.Thread):
    """A step of its own thread: its connection's id, then a BLPOP on `key` that waits for the
    test (`replies`, or the prq error the step ended with in `error`)."""

    def __init__(self, io: SyncRedisIO, key: str = "go", *, client_id: bool = True) -> None:
        super().__init__(daemon=True)
        self.io = io
        self.key = key
        #: (a cluster has no node for a call without a key: its batch is the BLPOP alone)
        self.calls = [Call(("CLIENT", "ID"))] if client_id else []
        self.replies: list[Reply] | None = None
        self.error: PrqError | None = None

    def run(self) -> None:
        try:
            self.replies = self.io.execute([*self.calls, Call(("BLPOP", self.key, BLOCK_S))])
        except PrqError as exc:
            self.error = exc


@pytest.fixture
def batch(io: SyncRedisIO, own_redis_client: redis.Redis) -> Batch:
    """A batch in flight: its thread's step waits in BLPOP."""
    thread = Batch(io)
    thread.start()
    wait_until(
        lambda: any(c["cmd"] == "blpop" for c in own_redis_client.client_list()),
        5, 0.01, "batch in flight",
    )  # fmt: skip
    return thread


def test_an_express_step_goes_beside_the_batch_in_flight_on_a_connection_of_its_own(
    io: SyncRedisIO, own_redis_client: redis.Redis, batch: Batch
) -> None:
    # Given a batch in flight (waiting in BLPOP)

    # When an express step is sent meanwhile
    replies = io.execute([Call(("CLIENT", "ID")), Call(("ECHO", "apart"))], express=True)

    # Then it is answered while the batch still waits, on another connection
    assert replies[1] == b"apart"
    assert batch.is_alive() and batch.replies is None
    own_redis_client.rpush("go", "x")
    batch.join(5)
    assert batch.replies is not None
    assert batch.replies[1] == [b"go", b"x"]
    assert replies[0] != batch.replies[0]

    # And a second express step finds the connection free again (two connections in all)
    assert io.execute([Call(("ECHO", "again"))], express=True) == [b"again"]
    assert len({c["id"] for c in own_redis_client.client_list() if c["cmd"] != "client|list"}) == 2


def test_a_step_that_is_not_express_waits_for_the_batch_in_flight(
    io: SyncRedisIO, own_redis_client: redis.Redis, batch: Batch
) -> None:
    # Given a batch in flight (waiting in BLPOP)

    # When another step is sent meanwhile from a thread of its own
    answered: list[object] = []
    other = threading.Thread(
        target=lambda: answered.append(io.execute([Call(("ECHO", "behind"))])), daemon=True
    )
    other.start()

    # Then it waits in line while the batch is in flight, and is answered only after it
    wait_until(lambda: len(io._pending) == 1, 5, 0.01, "the step in line")
    assert answered == [] and batch.is_alive()
    own_redis_client.rpush("go", "x")
    batch.join(5)
    other.join(5)
    assert answered == [[b"behind"]]


def test_a_closed_batcher_sends_no_express_step(io: SyncRedisIO) -> None:
    assert io.execute([Call(("PING",))], express=True) in ([b"PONG"], [True], ["PONG"])
    io.close()
    with pytest.raises(QueueShutdown):
        io.execute([Call(("PING",))], express=True)


def test_a_thread_whose_own_step_waited_past_its_bound_sends_nothing_for_the_steps_behind_it(
    io: SyncRedisIO, own_redis_client: redis.Redis, batch: Batch
) -> None:
    # Given a batch in flight (waiting in BLPOP), and behind it a step that has waited past its
    # budget and the grace (its age set back rather than waited out)
    late = Batch(io, "never")
    late.start()
    wait_until(lambda: len(io._pending) == 1, 5, 0.01, "the late step in line")
    with io._lock:
        io._pending[0].asked -= io.settings.retry_budget_s + STEP_GRACE_S + 1.0
    # And behind that one a step still in time, which waits in BLPOP once sent
    young = Batch(io, "young")
    young.start()
    wait_until(lambda: len(io._pending) == 2, 5, 0.01, "the young step in line")

    # When the batch in flight ends (the lead passes to the late step's thread)
    own_redis_client.rpush("go", "x")
    batch.join(5)

    # Then the late step's thread gives its step up and returns at once: it does not send the
    # young step and wait a round trip (up to a socket timeout) past its own bound for it
    late.join(5)
    assert not late.is_alive(), "the late step's thread is serving the step behind it"
    assert late.replies is None and isinstance(late.error, QueueUnavailable)
    # And the young step goes out on its own thread, and is answered
    wait_until(
        lambda: any(c["cmd"] == "blpop" for c in own_redis_client.client_list()),
        5, 0.01, "the young step in flight",
    )  # fmt: skip
    assert young.is_alive()
    own_redis_client.rpush("young", "y")
    young.join(5)
    assert young.error is None and young.replies is not None
    assert young.replies[1] == [b"young", b"y"]


def test_on_a_cluster_a_step_does_not_wait_for_a_batch_held_up_on_a_shard(
    redis_admin_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    # (on one server a step waits for the batch in flight, above: its link is one connection)
    if not redis_admin_url.startswith("redis+cluster://"):
        pytest.skip("needs the shared Redis to be a cluster (the cluster pass runs it)")
    batcher = SyncRedisIO(RedisSettings(url=redis_admin_url, socket_timeout_s=20), QueueSettings())
    held_up, other = f"{key_prefix}:go:{{a}}", f"{key_prefix}:other:{{b}}"
    try:
        # Given a batch in flight, held up on one shard (waiting in BLPOP there, as a round
        # trip waits on a node that accepts and never answers)
        batch = Batch(batcher, held_up, client_id=False)
        batch.start()

        def blocked() -> bool:
            per_node: Any = redis_client.client_list(target_nodes="all")  # {node: its clients}
            return any(c["cmd"] == "blpop" for clients in per_node.values() for c in clients)

        wait_until(blocked, 5, 0.01, "batch in flight")

        # When another thread sends a step meanwhile (a close's hand-back, a call's enqueue)
        answered: list[object] = []
        step = threading.Thread(
            target=lambda: answered.append(batcher.execute([Call(("GET", other))])), daemon=True
        )
        step.start()

        # Then it is answered while the batch is still held up: it led a batch of its own
        wait_until(lambda: answered != [], 5, 0.01, "the step answered")
        assert answered == [[None]]
        assert batch.is_alive() and batch.replies is None
        redis_client.rpush(held_up, "x")
        batch.join(5)
        assert batch.replies == [[held_up.encode(), b"x"]]
    finally:
        batcher.close()
