"""Self-tests of the fault proxy: each mode against a real redis-server, and the RESP splitter."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from prq.embedded import EmbeddedRedis
from tests.fault.proxy import FaultProxy
from tests.fault.resp import RespError, RespFrames, is_pubsub_message
from tests.fault.timings import FAULT_TIMINGS, FaultQueueFactory
from tests.redis_servers import wait_until

pytestmark = pytest.mark.fault

MakeProxy = Callable[..., FaultProxy]

#: Frames of every RESP2/RESP3 type, including a bulk payload that holds CRLF and a "message".
FRAMES = [
    b"+OK\r\n",
    b"-ERR wrong\r\n",
    b":42\r\n",
    b"$-1\r\n",
    b"$0\r\n\r\n",
    b"$13\r\nab\r\n*3\r\n$7\r\nm\r\n",
    b"*-1\r\n",
    b"*0\r\n",
    b"*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n",
    b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$5\r\nhello\r\n",
    b">4\r\n$8\r\npmessage\r\n$2\r\nc*\r\n$2\r\nch\r\n$1\r\nx\r\n",
    b"*2\r\n*2\r\n:1\r\n$1\r\na\r\n%1\r\n+k\r\n~2\r\n_\r\n#t\r\n",
    b",3.14\r\n",
    b"(12345678901234567890\r\n",
    b"!5\r\nerror\r\n",
    b"=8\r\ntxt:abcd\r\n",
    b"|1\r\n+ttl\r\n:3\r\n$3\r\nval\r\n",
    b"%0\r\n",
]


def _client(url: str, timeout_s: float = 2.0, protocol: int = 3) -> redis.Redis:
    """A redis-py client that does not retry (so a fault shows as it is)."""
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
        protocol=protocol,
    )


@contextlib.contextmanager
def client(url: str, timeout_s: float = 2.0, protocol: int = 3) -> Iterator[redis.Redis]:
    c = _client(url, timeout_s, protocol)
    try:
        yield c
    finally:
        c.close()


def test_resp_frames_survive_any_split() -> None:
    # Given every frame type back to back
    stream = b"".join(FRAMES)
    # When the stream arrives cut at any point (and byte by byte)
    for cut in range(len(stream) + 1):
        parser = RespFrames()
        frames = parser.feed(stream[:cut]) + parser.feed(stream[cut:])
        # Then the same frames come out, whole, in order
        assert frames == FRAMES, cut
        assert parser.pending_bytes == 0
    parser = RespFrames()
    assert [f for i in range(len(stream)) for f in parser.feed(stream[i : i + 1])] == FRAMES


def test_resp_message_classification_and_garbage() -> None:
    push, pmessage, subscribe = FRAMES[9], FRAMES[10], FRAMES[8]
    assert is_pubsub_message(push, resp2_subscriber=False)
    assert is_pubsub_message(pmessage, resp2_subscriber=False)
    assert not is_pubsub_message(subscribe, resp2_subscriber=True)
    resp2 = b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$1\r\nx\r\n"
    assert is_pubsub_message(resp2, resp2_subscriber=True)
    assert not is_pubsub_message(resp2, resp2_subscriber=False)  # could be an LRANGE reply
    with pytest.raises(RespError):
        RespFrames().feed(b"REDIS0011\xfa\tredis-ver\r\n")


def test_pass_through(fault_redis: EmbeddedRedis, make_proxy: MakeProxy) -> None:
    proxy = make_proxy()
    with client(proxy.url) as c:
        assert c.ping()
        c.set("big", b"x" * 300_000)
        assert c.get("big") == b"x" * 300_000
    assert proxy.accepted == 1


def test_cut_resets_and_refuses_until_restore(make_proxy: MakeProxy) -> None:
    proxy = make_proxy()
    with client(proxy.url) as c:
        assert c.ping()
        # When the link is cut
        assert proxy.cut() == 1
        # Then the open connection fails, and a new connect is refused
        with pytest.raises(redis.ConnectionError):
            c.ping()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", proxy.port), timeout=2).close()
        # And after restore the same client works again
        proxy.restore()
        assert c.ping()


def test_reset_connections_keeps_accepting(make_proxy: MakeProxy) -> None:
    proxy = make_proxy()
    # One open connection (not a pool: a pool quietly replaces a connection it sees reset)
    old = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
    try:
        old.sendall(b"PING\r\n")
        assert old.recv(16) == b"+PONG\r\n"
        # When every open connection is reset
        assert proxy.reset_connections() == 1
        # Then the next command on it fails with a reset (RST, not FIN)
        with pytest.raises(ConnectionResetError):
            old.sendall(b"PING\r\n")
            old.recv(16)
        # And a new connection works
        with client(proxy.url) as new:
            assert new.ping()
        assert proxy.resets == 1
    finally:
        old.close()


def test_reset_pubsub_connections_only(make_proxy: MakeProxy) -> None:
    proxy = make_proxy()
    with client(proxy.url) as c:
        pubsub = c.pubsub()  # type: ignore[no-untyped-call, unused-ignore]
        try:
            pubsub.subscribe("ch")
            assert pubsub.get_message(timeout=2) is not None
            assert c.ping()
            # When only pub/sub connections are reset
            assert proxy.reset_connections(pubsub_only=True) == 1
            # Then the command connection is untouched
            assert proxy.open_connections == 1
            assert c.ping()
            assert proxy.accepted == 2
        finally:
            pubsub.close()


def test_blackhole_times_out_without_reset_and_holds_bytes(
    fault_redis: EmbeddedRedis, make_proxy: MakeProxy
) -> None:
    proxy = make_proxy()
    with client(proxy.url, timeout_s=0.3) as c, client(fault_redis.url) as direct:
        assert c.ping()
        raw = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        try:
            # When the link is a blackhole
            proxy.blackhole()
            # Then a command times out (no reset), and a new connect is still accepted
            started = time.monotonic()
            with pytest.raises(redis.TimeoutError):
                c.ping()
            assert time.monotonic() - started >= 0.25
            assert proxy.resets == 0
            raw.sendall(b"*2\r\n$4\r\nINCR\r\n$4\r\nheld\r\n")
            assert direct.get("held") is None
            # And the held command runs once the link heals (TCP-like)
            proxy.restore()
            wait_until(lambda: direct.get("held") == b"1", 5, message="held INCR applied")
            assert raw.recv(16) == b":1\r\n"
        finally:
            raw.close()


def test_blackhole_drop_discards_and_resets_on_restore(
    fault_redis: EmbeddedRedis, make_proxy: MakeProxy
) -> None:
    proxy = make_proxy()
    with client(fault_redis.url) as direct:
        raw = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        try:
            raw.sendall(b"PING\r\n")
            assert raw.recv(16) == b"+PONG\r\n"
            proxy.blackhole(drop=True)
            raw.sendall(b"*2\r\n$4\r\nINCR\r\n$4\r\nlost\r\n")
            wait_until(lambda: proxy.discarded_bytes > 0, 5, message="INCR discarded")
            proxy.restore()
            # The dropped INCR never ran, and the connection that lost bytes was reset
            assert raw.recv(16) == b""
        except ConnectionResetError:
            pass
        finally:
            raw.close()
        assert direct.get("lost") is None


@pytest.mark.parametrize("protocol", [2, 3])
def test_drop_pubsub_messages_only(
    fault_redis: EmbeddedRedis, make_proxy: MakeProxy, protocol: int
) -> None:
    proxy = make_proxy()
    with client(proxy.url, protocol=protocol) as c, client(fault_redis.url) as direct:
        pubsub = c.pubsub()  # type: ignore[no-untyped-call, unused-ignore]
        try:
            # Given message dropping is on before the subscriber attaches
            proxy.drop_pubsub_messages(True)
            pubsub.subscribe("ch")
            pubsub.psubscribe("c*")
            got = [pubsub.get_message(timeout=2) for _ in range(2)]
            # Then subscribe confirmations still arrive
            assert [m["type"] for m in got if m] == ["subscribe", "psubscribe"]
            # When messages (one large: split across reads) are published, then a PING:
            # the pong arrives, the messages do not
            assert direct.publish("ch", "lost" * 100_000) == 2
            pubsub.ping()
            pong = pubsub.get_message(timeout=2)
            assert pong is not None and pong["type"] == "pong", pong
            assert proxy.dropped_frames == 2
            # And once dropping is off, messages flow again
            proxy.drop_pubsub_messages(False)
            direct.publish("ch", "kept")
            seen = [pubsub.get_message(timeout=2) for _ in range(2)]
            assert sorted(m["type"] for m in seen if m) == ["message", "pmessage"]
            # And ordinary replies on a normal connection were never touched
            assert c.ping()
        finally:
            pubsub.close()


def test_latency_delays_round_trips(make_proxy: MakeProxy) -> None:
    proxy = make_proxy()
    with client(proxy.url) as c:
        assert c.ping()
        proxy.latency(100)
        started = time.monotonic()
        assert c.ping()
        assert time.monotonic() - started >= 0.2  # 100 ms each way
        proxy.latency(0)
        started = time.monotonic()
        assert c.ping()
        assert time.monotonic() - started < 0.2  # no longer delayed


def test_retarget_sends_new_connections_elsewhere(
    fault_redis: EmbeddedRedis, make_proxy: MakeProxy
) -> None:
    with EmbeddedRedis() as other, client(other.url) as other_direct:
        other_direct.set("who", "other")
        proxy = make_proxy()
        with client(proxy.url) as old:
            old.set("who", "first")
            proxy.retarget(other.port)
            with client(proxy.url) as new:
                assert new.get("who") == b"other"
            assert old.get("who") == b"first"  # open connections stay where they were
        with pytest.raises(ValueError):
            proxy.retarget(6379, host="10.0.0.1")


def test_close_is_bounded_and_refuses(make_proxy: MakeProxy) -> None:
    proxy = make_proxy()
    with client(proxy.url) as c:
        assert c.ping()
        started = time.monotonic()
        proxy.close()
        assert time.monotonic() - started < 5
        with pytest.raises(redis.ConnectionError):
            c.ping()


async def test_in_process_nodes_through_a_proxy_and_direct(
    fault_queues: FaultQueueFactory, make_proxy: MakeProxy
) -> None:
    # Given two nodes on one prefix: a sender behind a proxy, a receiver straight to Redis
    proxy = make_proxy()
    sender = fault_queues(url=proxy.url)
    receiver = fault_queues()
    fault_queues.serve(receiver, "poll://bed", lambda request: request.params)
    # When the sender's pub/sub messages are dropped
    assert await sender.call("poll://bed", "echo", {"n": 1}) == {"n": 1}
    proxy.drop_pubsub_messages(True)
    # Then its call still completes (by polling), and the proxy really dropped the pulse
    started = time.monotonic()
    assert await sender.call("poll://bed", "echo", {"n": 2}) == {"n": 2}
    assert time.monotonic() - started < FAULT_TIMINGS["poll_interval_s"] + 1.0
    assert proxy.dropped_frames >= 1
