"""The suite's Redis Cluster test bed (tests/cluster_servers.py): it forms, spreads the slots
over its masters, and a cluster client reads and writes keys of every shard; prq runs on it
through a redis+cluster:// URL, as the shipped users.acl's least-privilege user, with each
endpoint's keys on the shard that owns its slot."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shlex
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.cluster
import yaml
from redis.crc import key_slot

from prq import AsyncQueue, DataLoss, Queue, QueueSettings, Request, Response
from prq.bulk import BulkClient
from prq.core.errors import ConfigurationError
from prq.core.keys import KeySchema
from prq.embedded import EmbeddedRedis
from prq.embedded.cluster import form_cluster, node_args
from tests import cluster_servers
from tests.cluster_servers import ClusterSet
from tests.queue_facades import call_after_loss
from tests.redis_servers import (
    PRQ_USER,
    USERS_ACL,
    CommandMonitor,
    acl_password,
    adapt_acl,
    async_wait_until,
    redis7_binary,
)

pytestmark = pytest.mark.integration

PREFIX = "prq:t-bed"


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterSet]:
    servers = ClusterSet()
    try:
        yield servers
    finally:
        servers.close()


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterSet]:
    servers = ClusterSet(acl_folder=Path(tmp_path_factory.mktemp("acl-cluster")))
    try:
        yield servers
    finally:
        servers.close()


def test_the_bed_forms_a_cluster_whose_keys_land_on_every_master(cluster: ClusterSet) -> None:
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.masters[0].port)
    try:
        keys = [f"prq:{{poll%3A%2F%2Fe{i}}}:seq" for i in range(60)]
        for key in keys:
            client.set(key, key)
        assert [client.get(key) for key in keys] == [key.encode() for key in keys]
        owners = {client.get_node_from_key(key).port for key in keys}  # type: ignore[no-untyped-call]
        assert owners == {master.port for master in cluster.masters}
    finally:
        client.close()


def endpoints_on_every_master(cluster: ClusterSet, client: redis.cluster.RedisCluster) -> list[str]:
    """One endpoint per master, found by where redis-py says its hash tag's slot lives."""
    chosen: dict[int, str] = {}
    for i in range(300):
        endpoint = f"poll://shard-{i}"
        tag = KeySchema(PREFIX).endpoint(endpoint).sequence
        chosen.setdefault(client.get_node_from_key(tag).port, endpoint)  # type: ignore[no-untyped-call]
        if len(chosen) == len(cluster.masters):
            break
    assert set(chosen) == {master.port for master in cluster.masters}
    return list(chosen.values())


def keys_by_master(cluster: ClusterSet) -> dict[int, list[str]]:
    found = {}
    for master in cluster.masters:
        with cluster.client(master) as c:
            found[master.port] = sorted(c.scan_iter(match=f"{PREFIX}:*", count=1000))
    return found


async def test_calls_reach_endpoints_on_every_master_and_each_one_keeps_to_its_shard(
    acl_cluster: ClusterSet,
) -> None:
    # Given a receiver serving one endpoint on each master, both facades calling them, as the
    # shipped users.acl's least-privilege user
    url = acl_cluster.url_for(PRQ_USER, acl_password(PRQ_USER))
    admin = acl_cluster.cluster_client()
    endpoints = endpoints_on_every_master(acl_cluster, admin)
    async with (
        AsyncQueue.from_url(url, prefix=PREFIX) as receiver,
        AsyncQueue.from_url(url, prefix=PREFIX) as caller,
    ):

        def answer(request: Request) -> str:
            return f"{request.endpoint}:{request.params}"

        serving = [asyncio.create_task(receiver.serve(e, answer)) for e in endpoints]
        with Queue.from_url(url, prefix=PREFIX) as blocking:
            # When each endpoint is called from both facades
            results = await asyncio.gather(
                *(caller.call(e, "m", i, timeout_s=20) for i, e in enumerate(endpoints))
            )
            blocking_results = [
                await asyncio.to_thread(blocking.call, e, "m", i, timeout_s=20)
                for i, e in enumerate(endpoints)
            ]
        for task in serving:
            task.cancel()
        await asyncio.gather(*serving, return_exceptions=True)

    # Then every call is answered by its endpoint's handler
    assert results == blocking_results == [f"{e}:{i}" for i, e in enumerate(endpoints)]
    # And each endpoint's keys live only on the master that owns its slot
    for port, keys in keys_by_master(acl_cluster).items():
        for key in keys:
            if ":canary:" in key:
                continue
            owner = admin.get_node_from_key(key).port  # type: ignore[no-untyped-call]
            assert owner == port, key
    assert sum(1 for keys in keys_by_master(acl_cluster).values() if keys) == len(endpoints)
    admin.close()


async def test_a_bulk_enqueue_spread_over_every_shard_is_drained(acl_cluster: ClusterSet) -> None:
    # Given 300 detached requests over one endpoint on each master, enqueued in bulk
    url = acl_cluster.url_for(PRQ_USER, acl_password(PRQ_USER))
    admin = acl_cluster.cluster_client()
    endpoints = endpoints_on_every_master(acl_cluster, admin)
    admin.close()
    requests = [
        Request(endpoint=endpoints[i % len(endpoints)], method="m", params=i) for i in range(300)
    ]
    with BulkClient.from_url(url, prefix=PREFIX) as bulk:
        result = bulk.enqueue_many(requests, batch_size=64)
        assert result.accepted == len(requests)
        # When one receiver drains every endpoint
        seen: list[object] = []
        async with AsyncQueue.from_url(url, prefix=PREFIX) as receiver:
            serving = [
                asyncio.create_task(receiver.serve(e, lambda r: seen.append(r.params)))
                for e in endpoints
            ]
            await async_wait_until(lambda: len(seen) == len(requests), 30)
            for task in serving:
                task.cancel()
            await asyncio.gather(*serving, return_exceptions=True)
        # Then each ran once, and the outcomes read back per endpoint say so
        assert sorted(int(str(n)) for n in seen) == list(range(len(requests)))
        for endpoint in endpoints:
            ids = [r.id for r in requests if r.endpoint == endpoint]
            states = {snapshot.state for snapshot in bulk.outcomes(endpoint, ids).values()}
            assert states == {"done"}


def _slots_of(cluster: ClusterSet, master: EmbeddedRedis) -> set[int]:
    """The slots `master` serves, as it says itself (CLUSTER SLOTS)."""
    with cluster.client(master) as c:
        ranges = c.execute_command("CLUSTER", "SLOTS")
    mine: set[int] = set()
    for start, end, primary, *_ in ranges:  # [start, end, [host, port, id], replicas...]
        if int(primary[1]) == master.port:
            mine.update(range(int(start), int(end) + 1))
    return mine


def test_a_thousand_endpoints_land_on_every_master_and_each_script_keeps_to_its_slot(
    acl_cluster: ClusterSet,
) -> None:
    # Given 1,000 endpoints, one request each, enqueued in bulk as the least-privilege user,
    # while every master records what it runs (MONITOR), its error counts reset
    url = acl_cluster.url_for(PRQ_USER, acl_password(PRQ_USER))
    prefix = "prq:t-spread"
    endpoints = [f"poll://spread-{i}" for i in range(1000)]
    for master in acl_cluster.masters:
        with acl_cluster.client(master) as c:
            c.config_resetstat()
    monitors = [CommandMonitor(master.url, keep=True) for master in acl_cluster.masters]
    with contextlib.ExitStack() as stack:
        for monitor in monitors:
            stack.enter_context(monitor)
        # When they are enqueued
        with BulkClient.from_url(url, prefix=prefix) as bulk:
            result = bulk.enqueue_many(
                [Request(endpoint=e, method="m", params=i) for i, e in enumerate(endpoints)],
                batch_size=500,
            )
    assert result.accepted == len(endpoints)

    # Then every master ran prq's scripts, none of them failed, and every key a script
    # touched on a master lies in that master's slots
    tag = re.compile(rb"^prq:t-spread:\{[^}]*\}")
    owners: dict[str, int] = {}
    for master, monitor in zip(acl_cluster.masters, monitors, strict=True):
        slots = _slots_of(acl_cluster, master)
        with acl_cluster.client(master) as c:
            evalsha = c.info("commandstats")["cmdstat_evalsha"]
            # (a script that touched a key of another slot fails: "non local key"; a script
            # not loaded yet on this master fails with NOSCRIPT and is loaded and run again,
            # which depends on what ran on this cluster before)
            not_loaded = c.info("errorstats").get("errorstat_NOSCRIPT", {}).get("count", 0)
            assert int(evalsha["calls"]) > 0, master.port
            assert int(evalsha["failed_calls"]) == int(not_loaded), master.port
        scripted = [command for kind, command in monitor.commands if kind == "lua"]
        assert scripted, master.port
        # (and the client never asked the server where a command's keys are)
        assert not [c for k, c in monitor.commands if k != "lua" and "GETKEYS" in c.upper()]
        for command in scripted:
            for word in shlex.split(command)[1:]:
                key = word.encode()
                if tag.match(key):
                    assert key_slot(key) in slots, (master.port, command)
                    owners.setdefault(key.split(b"}")[0].decode(), master.port)
    # And the 1,000 endpoints spread over the three masters, each endpoint on one of them
    assert len(owners) == len(endpoints)
    per_master = Counter(owners.values())
    assert set(per_master) == {m.port for m in acl_cluster.masters}
    assert min(per_master.values()) > len(endpoints) // 6


def test_the_compose_profile_forms_its_cluster_as_the_shipped_users(tmp_path: Path) -> None:
    # Given six nodes started as docker-compose.yml's cluster profile starts them: the shipped
    # users plus redis-conf/cluster-admin.acl's, cluster mode, replicas logging in as
    # prq-replica (here on loopback ports instead of the compose services)
    binary, version = redis7_binary()
    conf = USERS_ACL.parent
    acl = tmp_path / "users.acl"
    acl.write_text(
        adapt_acl((conf / "users.acl").read_text(), version).rstrip("\n")
        + "\n"
        + (conf / "cluster-admin.acl").read_text()
    )
    replication = ["--masteruser", "prq-replica", "--masterauth", acl_password("prq-replica")]
    nodes = [
        EmbeddedRedis(
            binary=binary,
            extra_args=["--aclfile", str(acl), *node_args(), *replication],
            username=PRQ_USER,
            password=acl_password(PRQ_USER),
            cluster_bus=True,
        )
        for _ in range(6)
    ]
    try:
        for node in nodes:
            node.start()
        # When the profile's cluster-init command runs, its addresses those of these nodes
        compose = USERS_ACL.parents[1] / "docker-compose.yml"
        init = yaml.safe_load(compose.read_text())["services"]
        script = init["cluster-init"]["command"][-1].replace("$$", "$")
        addresses = " ".join(f"127.0.0.1:{node.port}" for node in nodes)
        script = re.sub(r"\$\(for node in .*?; done\)", addresses, script)
        redis_cli = shutil.which("redis-cli")
        assert redis_cli is not None, "redis-cli (Debian's redis-tools) is needed"
        done = subprocess.run(
            ["sh", "-c", script], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert "All 16384 slots covered" in done.stdout

        # Then prq calls through it as the shipped app user
        url = f"redis+cluster://{PRQ_USER}:{acl_password(PRQ_USER)}@127.0.0.1:{nodes[0].port}/0"

        async def call() -> object:
            async with AsyncQueue.from_url(url) as receiver, AsyncQueue.from_url(url) as caller:
                serving = asyncio.create_task(receiver.serve("poll://compose", lambda r: r.params))
                try:
                    return await caller.call("poll://compose", "m", "via the profile", timeout_s=30)
                finally:
                    serving.cancel()
                    await asyncio.gather(serving, return_exceptions=True)

        assert asyncio.run(call()) == "via the profile"
    finally:
        for node in nodes:
            node.cleanup()


#: Short data-loss checks and long polls: only the watch (not a poll) can notice a loss.
WATCHED = QueueSettings(data_loss_check_interval_s=0.3, poll_interval_s=30.0, pickup_timeout_s=60)


@pytest.fixture
def own_cluster() -> Iterator[ClusterSet]:
    """A cluster of the test's own: it flushes one of its shards."""
    servers = ClusterSet()
    try:
        yield servers
    finally:
        servers.close()


def _owner(cluster: ClusterSet, client: redis.cluster.RedisCluster, endpoint: str) -> EmbeddedRedis:
    port = client.get_node_from_key(KeySchema(PREFIX).endpoint(endpoint).sequence).port  # type: ignore[no-untyped-call]
    return next(m for m in cluster.masters if m.port == port)


async def test_a_flushed_shard_fails_exactly_the_calls_whose_requests_lived_there(
    own_cluster: ClusterSet,
) -> None:
    # Given calls from both facades to an endpoint on every master, each request held by a
    # receiver
    admin = own_cluster.cluster_client()
    endpoints = endpoints_on_every_master(own_cluster, admin)
    flushed = endpoints[1]
    async with (
        AsyncQueue.from_url(own_cluster.url, prefix=PREFIX, settings=WATCHED) as receiver,
        AsyncQueue.from_url(own_cluster.url, prefix=PREFIX, settings=WATCHED) as caller,
    ):
        blocking = Queue.from_url(own_cluster.url, prefix=PREFIX, settings=WATCHED)
        calls = {e: asyncio.create_task(caller.call(e, "m", e)) for e in endpoints}
        blocking_calls = {
            e: asyncio.create_task(asyncio.to_thread(blocking.call, e, "b", e)) for e in endpoints
        }
        held = []
        for endpoint in endpoints:
            for _ in range(2):
                pending = await receiver.dequeue(endpoint, timeout_s=10)
                assert pending is not None
                held.append(pending)
        assert caller.stats.data_loss_events == 0
        assert not any(c.done() for c in [*calls.values(), *blocking_calls.values()])

        # When one master loses its data (its replica follows)
        with own_cluster.client(_owner(own_cluster, admin, flushed)) as c:
            c.flushall()

        # Then the calls to that master's endpoint fail with DataLoss, and its held requests
        # are cancelled with reason data_loss
        for failing in (calls[flushed], blocking_calls[flushed]):
            with pytest.raises(DataLoss):
                await asyncio.wait_for(failing, 10)
        lost = [p for p in held if p.request.endpoint == flushed]
        await async_wait_until(lambda: all(p.cancelled for p in lost), 10, 0.05, "cancelled")
        assert {p.cancel_reason for p in lost} == {"data_loss"}
        # And nothing on the other shards: their requests are still held, their calls answered
        kept = [p for p in held if p.request.endpoint != flushed]
        assert not any(p.cancelled for p in kept)
        for pending in kept:
            await receiver.apply_response(
                Response(id=pending.id, result=f"{pending.request.method}:{pending.request.params}")
            )
        for endpoint in endpoints:
            if endpoint != flushed:
                assert await asyncio.wait_for(calls[endpoint], 10) == f"m:{endpoint}"
                assert await asyncio.wait_for(blocking_calls[endpoint], 10) == f"b:{endpoint}"
        # And the shard works again: a new call there is answered
        serving = asyncio.create_task(receiver.serve(flushed, lambda r: r.params))
        assert await call_after_loss(caller, flushed, "m", 7, 10) == 7
        assert await asyncio.to_thread(blocking.call, flushed, "m", 8, timeout_s=10) == 8
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        assert caller.stats.data_loss_events == receiver.stats.data_loss_events == 1
        blocking.close()
    admin.close()


async def test_pulses_use_one_sharded_link_per_master_and_a_channel_per_endpoint(
    cluster: ClusterSet,
) -> None:
    # Given a receiver serving an endpoint on every master, and polls 30 s apart: a call
    # answered within its 10 s timeout was woken by a pulse
    slow_polls = QueueSettings(poll_interval_s=30.0)
    admin = cluster.cluster_client()
    endpoints = endpoints_on_every_master(cluster, admin)
    async with (
        AsyncQueue.from_url(cluster.url, prefix=PREFIX, settings=slow_polls) as receiver,
        AsyncQueue.from_url(cluster.url, prefix=PREFIX, settings=slow_polls) as caller,
    ):
        serving = [asyncio.create_task(receiver.serve(e, lambda r: r.params)) for e in endpoints]
        blocking = Queue.from_url(cluster.url, prefix=PREFIX, settings=slow_polls)

        async def calls(n: int) -> None:
            for i in range(n):
                for e in endpoints:
                    assert await caller.call(e, "m", i, timeout_s=10) == i
                    assert await asyncio.to_thread(blocking.call, e, "m", i, timeout_s=10) == i

        # When each endpoint is called from both facades, a few times and then many times
        await calls(2)
        held = [(q._pulses.links, q._pulses.subscriptions) for q in (caller, receiver, blocking)]
        await calls(20)

        # Then each node holds one pub/sub link per master, and a channel per endpoint (the
        # receiver also its pulse channels), however many requests went by
        assert held == [(3, 3), (3, 6), (3, 3)]
        assert [
            (q._pulses.links, q._pulses.subscriptions) for q in (caller, receiver, blocking)
        ] == held
        # And each master counts the subscribers of the channels in its own slots, none classic
        for node_id in (caller.node_id, blocking.node_id):
            for endpoint in endpoints:
                channel = KeySchema(PREFIX, sharded=True).endpoint(endpoint).node_channel(node_id)
                with cluster.client(_owner(cluster, admin, endpoint)) as c:
                    assert c.execute_command("PUBSUB", "SHARDNUMSUB", channel) == [channel, 1]
        for master in cluster.masters:
            with cluster.client(master) as c:
                assert c.execute_command("PUBSUB", "NUMPAT") == 0
                assert not [ch for ch in c.execute_command("PUBSUB", "CHANNELS") if PREFIX in ch]
        blocking.close()
        for task in serving:
            task.cancel()
        await asyncio.gather(*serving, return_exceptions=True)
    admin.close()


def _refusals(probes: list[redis.Redis]) -> list[int]:
    """How many commands each master refused with ERR so far (INFO errorstats: a refused
    subcommand is counted there; MONITOR never shows it, as it does not run)."""
    out = []
    for probe in probes:
        stats = probe.info("errorstats")
        out.append(int(stats.get("errorstat_ERR", {}).get("count", 0)))
    return out


async def test_prq_opens_cluster_connections_without_commands_redis_7_refuses(
    cluster: ClusterSet,
) -> None:
    # Given a connection to every master that counts what the master refused (a Redis 7
    # server refuses CLIENT MAINT_NOTIFICATIONS, and before 7.2 CLIENT SETINFO; sent on
    # connect, such a refusal can be read as the reply of a command, and a call then fails
    # although its request ran: seen in fault scenario 20)
    probes = [cluster.client(master) for master in cluster.masters]
    try:
        before = _refusals(probes)
        # When both facades connect and call an endpoint, and serve it
        async with (
            AsyncQueue.from_url(cluster.url, prefix=PREFIX) as receiver,
            AsyncQueue.from_url(cluster.url, prefix=PREFIX) as caller,
        ):
            serving = asyncio.create_task(receiver.serve("poll://handshake", lambda r: r.params))
            assert await caller.call("poll://handshake", "m", 1, timeout_s=20) == 1
            with Queue.from_url(cluster.url, prefix=PREFIX) as blocking:
                called = asyncio.to_thread(blocking.call, "poll://handshake", "m", 2, timeout_s=20)
                assert await called == 2
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
        # Then no master refused anything they sent
        assert _refusals(probes) == before
    finally:
        for probe in probes:
            probe.close()


def test_a_formation_that_fails_is_tried_again_on_fresh_nodes(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a first formation that does not finish (as one did once on a loaded machine)
    attempts: list[list[int]] = []

    def once_too_slow(masters: list[EmbeddedRedis], *args: object) -> None:
        attempts.append([m.port for m in masters])
        if len(attempts) == 1:
            raise ConfigurationError("the local cluster did not form in 60 s: (made up)")
        form_cluster(masters, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(cluster_servers, "form_cluster", once_too_slow)
    # When the bed is made
    servers = ClusterSet()
    try:
        # Then it formed on fresh nodes at the second attempt, and said why it tried again,
        # with what each node of the first attempt said
        assert len(attempts) == 2 and not set(attempts[0]) & set(attempts[1])
        assert "attempt 1 failed" in caplog.text and "-- " in caplog.text
        with servers.cluster_client() as client:
            assert client.set("bed:retried", "1") and client.get("bed:retried") == b"1"
    finally:
        servers.close()
