"""Redis servers for the suite, and the bounded waits every test uses instead of sleeps.

- The session shares one server: `PRQ_TEST_REDIS_URL` if set, else a private `EmbeddedRedis` on a
  free loopback port (never 127.0.0.1:6379) started with the shipped `redis-conf/users.acl`
  (`acl_server`): prq's nodes then log in as its least-privilege `prq` user, and the tests' own
  reads and clean-ups as a superuser of the test's own. Key prefixes are `prq:t-<hex>`, inside
  the `prq:*` keys the ACL grants.
- `wait_until` / `async_wait_until` poll a predicate until it holds or a deadline passes (then
  fail the test); `async_stays_false` asserts that something does NOT happen inside a window.
- `scan_keys` lists the keys of one prefix; `CommandMonitor` records the commands clients send
  (MONITOR) between two sentinels, so a test can count what reached the server.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import shutil
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis
import redis.cluster

from prq.embedded import EmbeddedRedis, find_server_binary
from prq.embedded.cluster import server_version
from prq.transport.topology import sync_client

__all__ = [
    "PRQ_USER",
    "CommandMonitor",
    "acl_server",
    "async_stays_false",
    "async_wait_until",
    "new_prefix",
    "scan_keys",
    "server_ms",
    "wait_until",
]

#: Environment variable naming an existing Redis for the shared server (optional).
TEST_REDIS_URL_ENV = "PRQ_TEST_REDIS_URL"
#: The shipped ACL, and the user prq's nodes run as under it.
USERS_ACL = Path(__file__).resolve().parents[1] / "redis-conf" / "users.acl"
PRQ_USER = "prq"
#: The tests' own superuser on a server started with the shipped ACL (never shipped).
TEST_ROOT_USER, TEST_ROOT_PASSWORD = "prq-test-root", "prq-test-root-password"
#: Default bound of a wait, seconds.
DEFAULT_WAIT_S = 10.0
#: Default interval between two checks of a predicate, seconds.
DEFAULT_INTERVAL_S = 0.01


def new_prefix() -> str:
    """A fresh key prefix, so tests sharing a server never see each other's keys (inside the
    `prq:*` keys and channels the shipped ACL grants its `prq` user)."""
    return f"prq:t-{uuid.uuid4().hex[:8]}"


def redis7_binary() -> tuple[str, tuple[int, int]]:
    """A redis-server of version 7 or later (ACL selectors like %R~ need 7.0)."""
    candidates = [find_server_binary(), "/usr/bin/redis-server", "/usr/local/bin/redis-server"]
    candidates += [
        found for name in ("redis-server", "valkey-server") if (found := shutil.which(name))
    ]
    for binary in dict.fromkeys(candidates):
        if Path(binary).is_file() and (version := server_version(binary)) >= (7, 0):
            return binary, version
    raise AssertionError(
        "the suite needs redis-server 7 or later (apt-get install redis-server, or set "
        f"PRQ_REDIS_SERVER); found only {candidates}"
    )


def adapt_acl(acl: str, version: tuple[int, int]) -> str:
    """The shipped ACL as a server of `version` accepts it: CLIENT SETINFO came with Redis 7.2,
    and an older server refuses a rule naming it (it never receives the command either:
    redis-py's SETINFO is an unknown command there, and ignored)."""
    return acl.replace(" +client|setinfo", "") if version < (7, 2) else acl


def acl_password(user: str) -> str:
    """The password the shipped users.acl gives `user` (its `>password` rule)."""
    for line in USERS_ACL.read_text().splitlines():
        words = line.split()
        if words[:2] == ["user", user]:
            found = re.search(r"(?:^|\s)>(\S+)", line)
            if found:
                return found.group(1)
    raise AssertionError(f"{USERS_ACL} gives {user!r} no password")


def acl_server(folder: Path, *, cluster_bus: bool = False) -> EmbeddedRedis:
    """A server that loads the shipped users.acl (its lines untouched) plus the tests' own
    superuser, written to `folder`; its `url` logs in as that superuser, and
    `url_for(PRQ_USER, acl_password(PRQ_USER))` as the least-privilege user."""
    binary, version = redis7_binary()
    acl = folder / "users.acl"
    acl.write_text(
        adapt_acl(USERS_ACL.read_text(), version).rstrip("\n")
        + f"\nuser {TEST_ROOT_USER} on >{TEST_ROOT_PASSWORD} ~* &* +@all\n"
    )
    return EmbeddedRedis(
        binary=binary,
        extra_args=["--aclfile", str(acl)],
        data_dir=folder,
        username=TEST_ROOT_USER,
        password=TEST_ROOT_PASSWORD,
        cluster_bus=cluster_bus,
    )


def wait_until(
    predicate: Callable[[], Any],
    timeout_s: float = DEFAULT_WAIT_S,
    interval_s: float = DEFAULT_INTERVAL_S,
    message: str = "",
) -> Any:
    """Poll `predicate` until it returns something truthy (returned) or fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout_s:g} s: {message}")
        time.sleep(interval_s)  # a poll interval, not a synchronisation


async def _evaluate(predicate: Callable[[], Any]) -> Any:
    value = predicate()
    if inspect.isawaitable(value):
        value = await value
    return value


async def async_wait_until(
    predicate: Callable[[], Any | Awaitable[Any]],
    timeout_s: float = DEFAULT_WAIT_S,
    interval_s: float = DEFAULT_INTERVAL_S,
    message: str = "",
) -> Any:
    """Async twin of `wait_until`; `predicate` may be a plain or a coroutine function."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await _evaluate(predicate)
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout_s:g} s: {message}")
        await asyncio.sleep(interval_s)  # a poll interval, not a synchronisation


async def async_stays_false(
    predicate: Callable[[], Any | Awaitable[Any]],
    window_s: float,
    interval_s: float = 0.02,
    message: str = "",
) -> None:
    """Assert that `predicate` stays falsy for the whole window (a negative timing assertion)."""
    deadline = time.monotonic() + window_s
    while time.monotonic() < deadline:
        if await _evaluate(predicate):
            raise AssertionError(f"condition became true within {window_s:g} s: {message}")
        await asyncio.sleep(interval_s)
    if await _evaluate(predicate):
        raise AssertionError(f"condition became true within {window_s:g} s: {message}")


def server_ms(client: redis.Redis) -> int:
    """The server's clock (TIME), in ms: what prq's scripts judge deadlines by."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def url_client(url: str) -> redis.Redis:
    """A client for the tests' own reads of `url`: redis-py's cluster client for a
    redis+cluster:// URL (typed as redis.Redis: it takes the same key commands)."""
    if url.startswith(("redis+cluster://", "rediss+cluster://")):
        return sync_client(url, {"socket_timeout": 10})  # type: ignore[no-any-return]
    return redis.Redis.from_url(url, socket_timeout=10)


def subscribers(client: redis.Redis, channel: str) -> int:
    """How many connections are subscribed to `channel`: classic pub/sub on one server; on a
    cluster, where prq's channels are shard channels, those of every node (SHARDNUMSUB)."""
    if isinstance(client, redis.cluster.RedisCluster):
        return sum(
            int(client.execute_command("PUBSUB SHARDNUMSUB", channel, target_nodes=node)[0][1])
            for node in client.get_nodes()
        )
    [(_, count)] = client.pubsub_numsub(channel)
    return int(count)


def publish(client: redis.Redis, channel: str, message: str) -> int:
    """Publish `message` as prq's scripts do (PUBLISH; SPUBLISH on a cluster); how many
    subscribers it reached."""
    if isinstance(client, redis.cluster.RedisCluster):
        return int(client.execute_command("SPUBLISH", channel, message))
    return int(client.publish(channel, message))


def scan_keys(client: redis.Redis, prefix: str) -> list[bytes]:
    """Every key of `prefix` (prefixes are glob-free, see KeySchema)."""
    return sorted(client.scan_iter(match=f"{prefix}:*", count=1000))


def request_keys(client: redis.Redis, prefix: str) -> list[bytes]:
    """Keys of `prefix` that traffic writes: all but the nodes' own data-loss canaries."""
    return [key for key in scan_keys(client, prefix) if b":canary:{" not in key]


def delete_prefix(client: redis.Redis, prefix: str) -> None:
    """Remove every key of `prefix` (teardown on a shared server)."""
    keys = scan_keys(client, prefix)
    for start in range(0, len(keys), 500):
        client.delete(*keys[start : start + 500])


class CommandMonitor:
    """Records the commands clients send to a server (MONITOR), between two sentinels.

    Commands that Lua scripts run are reported by MONITOR as coming from `lua`; they are kept
    apart (`lua`) from what clients sent (`client`), because only the latter cost a client a
    command. The sentinels are `ECHO` commands sent by this object and are not recorded.
    Use only on a server owned by the test (MONITOR sees every client).
    """

    def __init__(self, url: str, *, keep: bool = False) -> None:
        self._client = redis.Redis.from_url(url, socket_timeout=10)
        self._token = uuid.uuid4().hex
        self._attached = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.client: Counter[str] = Counter()
        self.lua: Counter[str] = Counter()
        #: With `keep`: every command recorded, as (client type, the command as MONITOR shows
        #: it: quoted arguments).
        self.keep = keep
        self.commands: list[tuple[str, str]] = []

    def __enter__(self) -> CommandMonitor:
        self._thread = threading.Thread(target=self._record, name="monitor", daemon=True)
        self._thread.start()

        def probe() -> bool:
            self._client.echo(f"prq-monitor-start-{self._token}")
            return self._attached.wait(0.05)

        wait_until(probe, timeout_s=10, message="MONITOR attached")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._client.echo(f"prq-monitor-end-{self._token}")
        assert self._thread is not None
        self._thread.join(timeout=10)
        self._client.close()
        if self._thread.is_alive():
            raise AssertionError("MONITOR did not see its end sentinel within 10 s")
        if self._error is not None:
            raise AssertionError(f"MONITOR failed: {self._error!r}")

    def _record(self) -> None:
        start, end = f"prq-monitor-start-{self._token}", f"prq-monitor-end-{self._token}"
        recording = False
        try:
            with self._client.monitor() as monitor:  # type: ignore[no-untyped-call]
                for entry in monitor.listen():
                    command: str = entry["command"]
                    name, _, rest = command.partition(" ")
                    name = name.upper()
                    if name == "ECHO" and rest.startswith("prq-monitor-"):
                        if rest == start:
                            recording = True
                            self._attached.set()
                        elif rest == end:
                            return
                        continue
                    if not recording:
                        continue
                    if entry["client_type"] == "lua":
                        self.lua[name] += 1
                    else:
                        self.client[name] += 1
                    if self.keep:
                        self.commands.append((entry["client_type"], command))
        except BaseException as exc:  # reported by __exit__
            self._error = exc
