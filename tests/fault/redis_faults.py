"""Redis-side faults on servers the test owns (`prq.embedded.EmbeddedRedis`), all bounded.

- `crash(server)` / `restart_empty(server)`: kill -9, and start again EMPTY on the same port
  (any snapshot on disk is removed first);
- `paused(server)`: SIGSTOP for the body of a `with`, SIGCONT on the way out (always);
- `flushall(server)`;
- `snapshot(server)` then `rollback_to_snapshot(server)`: SAVE (or BGSAVE) at a chosen moment,
  later kill -9 and start from that older dump.rdb — Redis comes back with the old data (time
  travel). The embedded server runs with `save ""` (no automatic snapshots) but honours an
  explicit SAVE and loads dump.rdb at start;
- `StaleReplica(primary)`: a replica fed through a `FaultProxy` (replication link only);
  `freeze()` blackholes that link so the replica stops receiving writes while both stay up,
  `promote()` kills the primary (-9) and runs `REPLICAOF NO ONE` on the replica, which is now a
  primary missing every write made after `freeze()`. Nodes that reach "the primary" through
  their own proxies follow it with `fail_over(proxies, replica)`;
- `ttl_auditor(server, prefix)`: samples SCAN + PTTL every interval while a scenario runs and
  records any key seen without a TTL.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import redis

from prq.embedded import EmbeddedRedis
from tests.fault.proxy import LOOPBACK, FaultProxy
from tests.redis_servers import wait_until

__all__ = [
    "StaleReplica",
    "TtlAuditor",
    "client_for",
    "crash",
    "fail_over",
    "flushall",
    "paused",
    "restart_empty",
    "rollback_to_snapshot",
    "snapshot",
]

#: Bound of each wait in this module, seconds.
FAULT_WAIT_S = 15.0


def client_for(server: EmbeddedRedis, timeout_s: float = 5.0) -> redis.Redis:
    """A plain client straight to `server` (bypassing every proxy)."""
    return redis.Redis(
        host=LOOPBACK, port=server.port, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
    )


def _info(server: EmbeddedRedis, section: str) -> dict[str, object]:
    with contextlib.closing(client_for(server)) as client:
        info: dict[str, object] = client.info(section)
        return info


def crash(server: EmbeddedRedis) -> float:
    """kill -9 the server; returns the monotonic time of the kill."""
    killed_at = time.monotonic()
    server.kill()
    return killed_at


def _remove_persistence(server: EmbeddedRedis) -> None:
    (server.data_dir / "dump.rdb").unlink(missing_ok=True)
    shutil.rmtree(server.data_dir / "appendonlydir", ignore_errors=True)


def restart_empty(server: EmbeddedRedis) -> float:
    """kill -9 (if running) and start EMPTY on the same port; returns when it answers PING."""
    server.kill()
    _remove_persistence(server)
    server.start(FAULT_WAIT_S)
    return time.monotonic()


@contextlib.contextmanager
def paused(server: EmbeddedRedis) -> Iterator[EmbeddedRedis]:
    """SIGSTOP the server for the body of the `with` (SIGCONT even if the body fails)."""
    server.pause()
    try:
        yield server
    finally:
        server.resume()


def flushall(server: EmbeddedRedis) -> None:
    """FLUSHALL (synchronous): every key, including prq's canaries and counters, is gone."""
    with contextlib.closing(client_for(server)) as client:
        client.flushall()


def snapshot(server: EmbeddedRedis, *, background: bool = False) -> Path:
    """Write dump.rdb now (SAVE, or BGSAVE and wait for it); returns its path."""
    with contextlib.closing(client_for(server, timeout_s=FAULT_WAIT_S)) as client:
        if not background:
            client.save()
        else:
            before = int(client.lastsave().timestamp())
            started = time.time()
            client.bgsave()

            def done() -> bool:
                info = client.info("persistence")
                if info["rdb_bgsave_in_progress"]:
                    return False
                assert info["rdb_last_bgsave_status"] == "ok", info
                return int(info["rdb_last_save_time"]) >= max(before, int(started))

            wait_until(done, FAULT_WAIT_S, 0.02, "BGSAVE finished")
    path = server.data_dir / "dump.rdb"
    assert path.is_file(), f"no snapshot at {path}"
    return path


def rollback_to_snapshot(server: EmbeddedRedis) -> float:
    """kill -9 and start again from the last `snapshot()` (older data); returns when up."""
    if not (server.data_dir / "dump.rdb").is_file():
        raise AssertionError("rollback_to_snapshot needs an earlier snapshot()")
    server.kill()
    shutil.rmtree(server.data_dir / "appendonlydir", ignore_errors=True)
    server.start(FAULT_WAIT_S)  # start() waits through LOADING
    return time.monotonic()


class StaleReplica:
    """A replica of `primary` that can be frozen, then promoted while stale (module docstring)."""

    def __init__(self, primary: EmbeddedRedis) -> None:
        self.primary = primary
        self.link = FaultProxy(primary.port, parse_resp=False, name="replication-link")
        self.replica = EmbeddedRedis(
            extra_args=["--replicaof", LOOPBACK, str(self.link.port), "--repl-timeout", "3600"]
        )
        self.frozen_at_offset: int | None = None

    def start(self) -> StaleReplica:
        """Start the replica and wait (bounded) until it has caught up with the primary."""
        with contextlib.closing(client_for(self.primary)) as client:
            # A full sync otherwise waits 5 s for more replicas to join it.
            client.config_set("repl-diskless-sync-delay", 0)
        self.replica.start(FAULT_WAIT_S)
        self.wait_in_sync()
        return self

    def offsets(self) -> tuple[int, int]:
        """(primary's replication offset, replica's processed offset)."""
        primary = _info(self.primary, "replication")
        replica = _info(self.replica, "replication")
        return int(str(primary["master_repl_offset"])), int(str(replica["master_repl_offset"]))

    def wait_in_sync(self, timeout_s: float = FAULT_WAIT_S) -> None:
        target = self.offsets()[0]

        def caught_up() -> bool:
            info = _info(self.replica, "replication")
            if info.get("master_link_status") != "up":
                return False
            return int(str(info["master_repl_offset"])) >= target

        wait_until(caught_up, timeout_s, 0.02, "replica in sync with the primary")

    def freeze(self) -> None:
        """Stop replication silently (the link holds every byte); the replica goes stale."""
        self.link.blackhole()
        self.frozen_at_offset = self.offsets()[1]

    def promote(self) -> EmbeddedRedis:
        """kill -9 the primary and make the (stale) replica a primary; returns the replica."""
        crash(self.primary)
        with contextlib.closing(client_for(self.replica)) as client:
            client.replicaof("NO", "ONE")
            wait_until(
                lambda: client.info("replication")["role"] == "master",
                FAULT_WAIT_S,
                0.02,
                "replica promoted",
            )
        self.link.cut()  # the held replication bytes must never arrive now
        return self.replica

    def close(self) -> None:
        self.link.close()
        self.replica.cleanup()

    def __enter__(self) -> StaleReplica:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def fail_over(proxies: Iterable[FaultProxy], new_primary: EmbeddedRedis) -> None:
    """Point node links at `new_primary`: new connections go there, open ones are reset."""
    for proxy in proxies:
        proxy.retarget(new_primary.port)
        proxy.reset_connections()


class TtlAuditor:
    """Samples SCAN + PTTL of a prefix every `interval_s` in a thread; records keys with no TTL.

    Use as a context manager around a scenario's load phase; `.no_ttl` holds the keys seen
    without a TTL at some sample, `.samples` how many samples were taken. Redis errors (the
    server is down mid-fault) skip a sample.
    """

    def __init__(self, server: EmbeddedRedis, prefix: str, interval_s: float = 1.0) -> None:
        self.server = server
        self.prefix = prefix
        self.interval_s = interval_s
        self.no_ttl: set[str] = set()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ttl-auditor", daemon=True)

    def sample(self) -> None:
        with contextlib.closing(client_for(self.server, timeout_s=1.0)) as client:
            for key in client.scan_iter(match=f"{self.prefix}:*", count=1000):
                if client.pttl(key) == -1:
                    self.no_ttl.add(key.decode() if isinstance(key, bytes) else str(key))
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(redis.RedisError, OSError):
                self.sample()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> TtlAuditor:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(FAULT_WAIT_S)
