"""redis-conf/users.acl: prq runs as its least-privilege user, and that user can do nothing else.

The server is a real redis-server started from the shipped redis-conf/redis.conf and a copy of
users.acl (its `prq` and `prq-admin` lines untouched), plus one superuser of the test's own that
reads `ACL LOG`. Redis checks every command against the ACL, the commands Lua scripts run
included, and logs each refusal in `ACL LOG`; so a command prq sends that the ACL does not grant
shows up there even when the caller swallows the error.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

from prq import (
    CancelledAfterPickup,
    CancelledBeforePickup,
    PickupTimeout,
    QueueShutdown,
    ReceiverLost,
    Request,
    RequestState,
    Response,
    current_request,
)
from prq.bulk import BulkClient
from prq.core.keys import KeySchema, encode_endpoint
from prq.embedded import free_port
from prq.ops.inspector import Inspector
from tests.queue_facades import AnyQueue, QueueFactory, SyncQueueAdapter, wait_for_state
from tests.redis_servers import adapt_acl, async_wait_until, redis7_binary, wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "redis-conf" / "redis.conf"
ACL = ROOT / "redis-conf" / "users.acl"
#: The test's own superuser (added to the copy of users.acl; never shipped).
ROOT_USER, ROOT_PASSWORD = "prq-test-root", "prq-test-root-password"
#: The key prefix the ACL grants (`~prq:*`).
PREFIX = "prq"
#: Small timings, so that heartbeats and data-loss check turns happen within the test.
ACL_SETTINGS: dict[str, Any] = {
    "heartbeat_interval_s": 0.2,
    "heartbeat_initial_delay_s": 0.1,
    "receiver_timeout_s": 3.0,
    "sender_timeout_s": 3.0,
    "data_loss_check_interval_s": 0.25,
    "poll_interval_s": 0.2,
}
#: Liveness timeouts of a second (beats every 0.2 s, below them), for lost nodes.
RARE_SETTINGS: dict[str, Any] = {
    **ACL_SETTINGS,
    "receiver_timeout_s": 1.0,
    "sender_timeout_s": 1.0,
}
SERVED = "poll://acl-served"
IDLE = "poll://acl-idle"
MANUAL = "poll://acl-manual"
BATCH = "poll://acl-batch"
ORPHAN = "poll://acl-orphan"
LOST = "poll://acl-lost"


# -- the server -----------------------------------------------------------------------------------


def acl_user(name: str) -> tuple[str, str]:
    """A user's line in users.acl and its password."""
    for line in ACL.read_text().splitlines():
        if line.startswith(f"user {name} "):
            password = next(token[1:] for token in line.split() if token.startswith(">"))
            return line, password
    raise AssertionError(f"users.acl has no user {name!r}")


class AclServer:
    """redis-server with the shipped redis.conf and users.acl, on a free loopback port."""

    def __init__(self) -> None:
        self.binary, version = redis7_binary()
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="prq-acl-"))
        acl = adapt_acl(ACL.read_text(), version)
        acl += f"user {ROOT_USER} on >{ROOT_PASSWORD} ~* &* +@all\n"
        (self.dir / "users.acl").write_text(acl)
        self.process = subprocess.Popen(
            [
                self.binary, str(CONF),
                "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
                "--logfile", str(self.dir / "redis.log"), "--aclfile", str(self.dir / "users.acl"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.root = self.client(ROOT_USER, ROOT_PASSWORD)

        def answers() -> bool:
            if self.process.poll() is not None:
                log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                raise AssertionError(f"redis-server exited: {log}")
            try:
                return bool(self.root.ping())
            except redis.ConnectionError:
                return False

        wait_until(answers, 10, 0.02, "redis-server with the shipped ACL answers")

    def url(self, user: str) -> str:
        _, password = acl_user(user)
        return f"redis://{user}:{password}@127.0.0.1:{self.port}/0"

    def client(self, user: str, password: str) -> redis.Redis:
        return redis.Redis(
            port=self.port, username=user, password=password, socket_timeout=10, protocol=3
        )

    def acl_log(self, user: str) -> list[dict[str, Any]]:
        """Refusals Redis logged for `user` (newest first)."""
        entries = send(self.root, "ACL", "LOG", "128")
        return [_text_map(entry) for entry in entries if _text_map(entry)["username"] == user]

    def stop(self) -> None:
        self.root.close()
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def send(client: redis.Redis, *args: Any) -> Any:
    """A raw command (redis-py leaves execute_command untyped)."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def _text_map(entry: Any) -> dict[str, Any]:
    if isinstance(entry, list):  # RESP2: a flat list of pairs
        entry = dict(zip(entry[::2], entry[1::2], strict=True))
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in entry.items()
    }


@pytest.fixture(scope="module")
def acl_server() -> Iterator[AclServer]:
    server = AclServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def server(acl_server: AclServer) -> Iterator[AclServer]:
    """The module's server, emptied and with an empty ACL LOG for each test."""
    acl_server.root.flushall()
    send(acl_server.root, "ACL", "LOG", "RESET")
    yield acl_server
    acl_server.root.flushall()


@pytest.fixture
async def app_queues(facade: str, server: AclServer) -> AsyncIterator[QueueFactory]:
    """Queues of the facade under test, connected as the application user `prq`."""
    factory = QueueFactory(facade, server.url("prq"), PREFIX)
    try:
        yield factory
    finally:
        await factory.aclose()


# -- the application user ------------------------------------------------------------------------


def _handler(facade: str) -> Any:
    """echo; slow (longer than a heartbeat interval); hold (until cancelled, at most 10 s)."""
    if facade == "async":

        async def handle(request: Request) -> object:
            pending = current_request()
            if request.method == "slow":
                await asyncio.sleep(0.8)  # the work the handler does, beating meanwhile
            if request.method == "hold" and pending is not None:
                await async_wait_until(lambda: pending.cancelled, 10, 0.01, "cancelled")
            return request.params

        return handle

    def handle_blocking(request: Request) -> object:
        pending = current_request()
        if request.method == "slow":
            time.sleep(0.8)  # the work the handler does, beating meanwhile
        if request.method == "hold" and pending is not None:
            pending.wait_cancelled(10)
        return request.params

    return handle_blocking


async def test_the_app_user_runs_prq_without_a_single_refusal(
    facade: str, server: AclServer, app_queues: QueueFactory
) -> None:
    # Given a receiver and a sender connected as the application user `prq`
    sender, receiver = app_queues(**ACL_SETTINGS), app_queues(**ACL_SETTINGS)
    app_queues.serve(receiver, SERVED, _handler(facade), concurrency=4)

    # When they make calls of every kind: a round trip, one slower than a heartbeat interval
    assert await asyncio.wait_for(sender.call(SERVED, "echo", {"n": 1}), 10) == {"n": 1}
    slow = Request(endpoint=SERVED, method="slow", params=[2])
    response = await asyncio.wait_for(sender.queue_and_wait(slow), 10)
    assert response.result == [2]
    assert (await receiver.status(slow.id)).state == RequestState.DONE
    assert sender.stats.heartbeats_sent > 0 and receiver.stats.heartbeats_sent > 0

    # ... a cancel before pickup, and one after
    await _cancel_before_pickup(sender, app_queues(**ACL_SETTINGS))
    await _cancel_after_pickup(sender)

    # ... a dequeue answered by hand, and a request nobody picks up
    await _dequeue_and_answer(sender, receiver)
    with pytest.raises(PickupTimeout):
        await asyncio.wait_for(sender.call(IDLE, "m", pickup_timeout_s=0.3), 10)

    # ... while the nodes' watch runs data-loss check turns, reporting the endpoints they use
    endpoints_key = KeySchema(PREFIX).endpoints
    await async_wait_until(
        lambda: server.root.zscore(endpoints_key, encode_endpoint(SERVED)) is not None,
        10,
        0.05,
        "a check turn registered the endpoint",
    )
    raw_receiver = receiver.raw if isinstance(receiver, SyncQueueAdapter) else receiver
    receivers_key = KeySchema(PREFIX).endpoint(SERVED).receivers
    await async_wait_until(
        lambda: server.root.zscore(receivers_key, raw_receiver.node_id) is not None,
        10,
        0.05,
        "a check turn reported the receiver",
    )
    # ... and the admin service's reads, which run as the application user too
    inspector = Inspector.from_url(server.url("prq"), prefix=PREFIX)
    try:
        assert SERVED in [info.endpoint for info in await inspector.endpoints()]
        assert (await inspector.endpoint(SERVED)).last_seen_ms > 0
        assert (await inspector.queued(IDLE)).total == 0
        assert (await inspector.redis_health()).ok
    finally:
        await inspector.aclose()

    # Then no data loss was seen, and Redis refused the application user nothing
    assert sender.stats.data_loss_events == 0 and receiver.stats.data_loss_events == 0
    assert_no_refusals(server, "prq")


async def test_the_app_user_takes_the_rare_paths_without_a_single_refusal(
    facade: str, server: AclServer, app_queues: QueueFactory
) -> None:
    # Given nodes connected as the application user, with liveness timeouts of a second
    sender, receiver = app_queues(**RARE_SETTINGS), app_queues(**RARE_SETTINGS)
    app_queues.serve(receiver, SERVED, _handler(facade), concurrency=2)

    # When a receiver takes several requests in one step and answers them by hand
    await _dequeue_many_and_answer(sender, app_queues(**RARE_SETTINGS))

    # ... a receiver holds a request whose sender goes away (sender_lost)
    await _sender_lost(app_queues(**RARE_SETTINGS), app_queues(**RARE_SETTINGS))

    # ... a receiver dies holding a request (its caller declares it lost)
    await _receiver_lost(sender, app_queues(**RARE_SETTINGS))

    # ... a request nobody picked up is sent again with the same id (enqueued afresh)
    retried = Request(endpoint=IDLE, method="m")
    for _ in range(2):
        with pytest.raises(PickupTimeout):
            await asyncio.wait_for(sender.queue_and_wait(retried, pickup_timeout_s=0.3), 10)

    # ... Redis forgets the scripts (SCRIPT FLUSH by an operator): the nodes load them again
    # (the call, or a watch turn that runs a script first; only prq's nodes load any)
    send(server.root, "SCRIPT", "FLUSH")
    assert await asyncio.wait_for(sender.call(SERVED, "echo", "again"), 10) == "again"
    assert cached_scripts(server) > 0

    # ... and Redis loses everything (FLUSHALL by an operator) while the nodes run their checks
    server.root.flushall()
    await async_wait_until(
        lambda: sender.stats.data_loss_events > 0 and receiver.stats.data_loss_events > 0,
        10,
        0.05,
        "both nodes declared the data loss",
    )
    # ... after which calls work again
    assert await asyncio.wait_for(sender.call(SERVED, "echo", "after"), 10) == "after"

    # Then Redis refused the application user nothing on any of these paths
    assert_no_refusals(server, "prq")


async def test_the_app_user_enqueues_in_bulk_without_a_single_refusal(
    server: AclServer, app_queues: QueueFactory
) -> None:
    # Given detached requests enqueued in bulk as the app user, twice (the second: duplicates)
    endpoint = "poll://acl-bulk"
    requests = [Request(endpoint=endpoint, method="echo", params=i, id=f"b:{i}") for i in range(5)]
    with BulkClient.from_url(server.url("prq"), prefix=PREFIX) as bulk:
        assert bulk.enqueue_many(requests).accepted == 5
        assert bulk.enqueue_many(requests).duplicates == 5
        # When a receiver serves them, Then their outcomes are read back as the app user
        receiver = app_queues()
        app_queues.serve(receiver, endpoint, _handler(app_queues.facade))
        ids = [r.id for r in requests]

        def all_done() -> bool:
            return all(o.state == "done" for o in bulk.outcomes(endpoint, ids).values())

        await async_wait_until(all_done, 10, 0.05, "bulk requests answered")
    assert_no_refusals(server, "prq")


def assert_no_refusals(server: AclServer, user: str) -> None:
    refusals = server.acl_log(user)
    assert refusals == [], f"commands {user} sent that users.acl does not grant: " + ", ".join(
        f"{entry['reason']} {entry['object']} ({entry['context']}, {entry['count']} times)"
        for entry in refusals
    )


def cached_scripts(server: AclServer) -> int:
    """Scripts Redis holds (SCRIPT LOAD adds one, SCRIPT FLUSH empties the cache)."""
    return int(server.root.info("memory")["number_of_cached_scripts"])


async def _dequeue_many_and_answer(sender: AnyQueue, receiver: AnyQueue) -> None:
    requests = [Request(endpoint=BATCH, method="m", params=i) for i in range(3)]
    calls = [asyncio.create_task(sender.queue_and_wait(r, pickup_timeout_s=30)) for r in requests]
    for request in requests:
        await wait_for_state(sender, request.id, RequestState.QUEUED)
    held = await receiver.dequeue_many(BATCH, 3, timeout_s=5)
    assert sorted(p.id for p in held) == sorted(r.id for r in requests)
    for pending in held:
        await receiver.apply_response(Response(id=pending.id, result=pending.request.params))
    responses = await asyncio.wait_for(asyncio.gather(*calls), 10)
    assert [response.result for response in responses] == [0, 1, 2]


async def _sender_lost(sender: AnyQueue, receiver: AnyQueue) -> None:
    request = Request(endpoint=ORPHAN, method="m")
    call = asyncio.create_task(sender.queue_and_wait(request, pickup_timeout_s=30))
    pending = await receiver.dequeue(ORPHAN, timeout_s=5)
    assert pending is not None and pending.id == request.id
    await sender.aclose()  # its watch loop stops: no more heartbeats for the request
    with pytest.raises(QueueShutdown):
        await asyncio.wait_for(call, 10)
    bound = RARE_SETTINGS["sender_timeout_s"] + 5
    assert await asyncio.to_thread(pending.wait_cancelled, bound), "never cancelled"
    assert pending.cancel_reason == "sender_lost"


async def _receiver_lost(sender: AnyQueue, receiver: AnyQueue) -> None:
    request = Request(endpoint=LOST, method="m")
    call = asyncio.create_task(sender.queue_and_wait(request, pickup_timeout_s=30))
    pending = await receiver.dequeue(LOST, timeout_s=5)
    assert pending is not None and pending.id == request.id
    await receiver.aclose()  # dies holding it: no more heartbeats, no response
    with pytest.raises(ReceiverLost):
        await asyncio.wait_for(call, RARE_SETTINGS["receiver_timeout_s"] + 5)


async def _cancel_before_pickup(sender: AnyQueue, other: AnyQueue) -> None:
    request = Request(endpoint=IDLE, method="m")
    call = asyncio.create_task(sender.queue_and_wait(request, pickup_timeout_s=30))
    await wait_for_state(sender, request.id, RequestState.QUEUED)
    assert await other.cancel(request.id) is True
    with pytest.raises(CancelledBeforePickup):
        await asyncio.wait_for(call, 10)


async def _cancel_after_pickup(sender: AnyQueue) -> None:
    request = Request(endpoint=SERVED, method="hold")
    call = asyncio.create_task(sender.queue_and_wait(request))
    await wait_for_state(sender, request.id, RequestState.TAKEN)
    await sender.cancel(request.id)
    with pytest.raises(CancelledAfterPickup):
        await asyncio.wait_for(call, 10)


async def _dequeue_and_answer(sender: AnyQueue, receiver: AnyQueue) -> None:
    call = asyncio.create_task(sender.call(MANUAL, "m", 7))
    pending = await receiver.dequeue(MANUAL, timeout_s=5)
    assert pending is not None
    await receiver.apply_response(Response(id=pending.id, result="by hand"))
    assert await asyncio.wait_for(call, 10) == "by hand"


#: What the application user must not do: (command, what `ACL DRYRUN` names as refused).
APP_REFUSED: list[tuple[tuple[str, ...], str]] = [
    (("FLUSHALL",), "'flushall' command"),
    (("FLUSHDB",), "'flushdb' command"),
    (("CONFIG", "GET", "save"), "'config|get' command"),
    (("CONFIG", "SET", "maxmemory-policy", "allkeys-lru"), "'config|set' command"),
    (("KEYS", "*"), "'keys' command"),
    (("SCAN", "0"), "'scan' command"),
    (("DEBUG", "SLEEP", "0"), "'debug' command"),
    (("EVAL", "return 1", "0"), "'eval' command"),
    (("SCRIPT", "FLUSH"), "'script|flush' command"),
    (("SHUTDOWN",), "'shutdown' command"),
    (("ACL", "LIST"), "'acl|list' command"),
    (("CLIENT", "KILL", "ID", "1"), "'client|kill' command"),
    (("SET", "other:key", "1"), "'other:key' key"),
    (("GET", "other:key"), "'other:key' key"),
    (("PUBLISH", "other:channel", "x"), "'other:channel' channel"),
    (("SUBSCRIBE", "other:channel"), "'other:channel' channel"),
]


@pytest.mark.parametrize(
    ("command", "refused"), APP_REFUSED, ids=[" ".join(command[:2]) for command, _ in APP_REFUSED]
)
def test_the_app_user_is_refused_what_prq_does_not_need(
    server: AclServer, command: tuple[str, ...], refused: str
) -> None:
    # Given the application user's rules, When Redis judges the command, Then it refuses it
    verdict = send(server.root, "ACL", "DRYRUN", "prq", *command)
    verdict = verdict.decode() if isinstance(verdict, bytes) else str(verdict)
    assert refused in verdict, verdict


def test_the_app_user_gets_noperm_and_scripts_cannot_escape_its_keys(server: AclServer) -> None:
    # Given a plain client logged in as the application user
    _, password = acl_user("prq")
    app = server.client("prq", password)
    try:
        # When it sends what the issue names, Then Redis answers NOPERM (DEBUG is off for all)
        for command in (("FLUSHALL",), ("CONFIG", "GET", "save"), ("KEYS", "*")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                send(app, *command)
        with pytest.raises(redis.exceptions.NoPermissionError):
            app.set("other:key", "1")
        with pytest.raises(redis.exceptions.ResponseError, match="DEBUG command not allowed"):
            send(app, "DEBUG", "SLEEP", "0")
        # And a script it may run cannot write outside prq:* either
        sha = app.script_load("return redis.call('SET', 'other:key', '1')")
        with pytest.raises(redis.exceptions.ResponseError, match="can't access"):
            app.evalsha(sha, 0)
        assert server.root.exists("other:key") == 0
        # While what prq does works
        assert app.set("prq:acl-probe", "1") and app.get("prq:acl-probe") == b"1"
    finally:
        app.close()


# -- the read-only admin user --------------------------------------------------------------------


async def test_the_admin_user_reads_with_the_inspector_but_writes_nothing(
    server: AclServer,
) -> None:
    # Given a request waiting on an endpoint (sent as the application user)
    factory = QueueFactory("async", server.url("prq"), PREFIX)
    try:
        sender = factory(**ACL_SETTINGS)
        request = Request(endpoint=IDLE, method="inspect-me")
        call = asyncio.create_task(sender.queue_and_wait(request, pickup_timeout_s=30))
        await wait_for_state(sender, request.id, RequestState.QUEUED)
        endpoints_key = KeySchema(PREFIX).endpoints
        await async_wait_until(
            lambda: server.root.zscore(endpoints_key, encode_endpoint(IDLE)) is not None,
            10,
            0.05,
            "the sender registered the endpoint",
        )

        # When the Inspector reads it as the read-only admin user
        inspector = Inspector.from_url(server.url("prq-admin"), prefix=PREFIX)
        try:
            infos = await inspector.endpoints()
            one = await inspector.endpoint(IDLE)
            page = await inspector.queued(IDLE)
            health = await inspector.redis_health()
            dead = await inspector.dead_letters(IDLE)
        finally:
            await inspector.aclose()

        # Then it sees the endpoint, its depth and the queued request, and Redis's health
        assert [(i.endpoint, i.depth, i.dead_letters) for i in infos] == [(IDLE, 1, 0)]
        assert dead == []
        assert one.depth == 1 and one.oldest_age_s is not None
        assert [item.id for item in page.items] == [request.id]
        assert health.ok and health.warnings == []
        # And Redis refused it nothing
        assert_no_refusals(server, "prq-admin")
        call.cancel()
    finally:
        await factory.aclose()


ADMIN_REFUSED: list[tuple[str, ...]] = [
    ("SET", "prq:x", "1"),
    ("DEL", "prq:endpoints"),
    ("HSET", "prq:{e}:r:1", "st", "done"),
    ("ZADD", "prq:{e}:q:0", "1", "x"),
    ("ZADD", "prq:endpoints", "1", "e"),
    ("EVAL", "return redis.call('SET', 'prq:x', '1')", "0"),
    ("EVALSHA", "0" * 40, "0"),
    ("EVAL_RO", "return 1", "0"),
    ("SCRIPT", "LOAD", "return 1"),
    ("PUBLISH", "prq:node:x", "r|1|"),
    ("SUBSCRIBE", "prq:node:x"),
    ("FLUSHALL",),
    ("CONFIG", "GET", "save"),
    ("KEYS", "*"),
    ("GET", "other:key"),
]


def test_the_admin_user_cannot_write_or_run_scripts(server: AclServer) -> None:
    # Given the read-only admin user
    _, password = acl_user("prq-admin")
    admin = server.client("prq-admin", password)
    try:
        # When it reads prq's keys, Then it may
        assert admin.get("prq:nothing") is None and admin.zcard("prq:{e}:lv") == 0
        # When it tries to change anything or run a script, Then Redis refuses
        for command in ADMIN_REFUSED:
            verdict = send(server.root, "ACL", "DRYRUN", "prq-admin", *command)
            assert (verdict.decode() if isinstance(verdict, bytes) else verdict) != "OK", command
        for command in ADMIN_REFUSED[:9]:
            with pytest.raises(redis.exceptions.NoPermissionError):
                send(admin, *command)
    finally:
        admin.close()
