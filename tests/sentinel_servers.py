"""A Sentinel set-up for the suite, on free loopback ports: a primary, a replica and one
sentinel watching them (quorum 1, a primary judged down after 1 s), all started by the test
that needs them, so it can fail the primary over."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import redis

from prq.embedded import EmbeddedRedis, find_server_binary, free_port
from tests.redis_servers import wait_until

__all__ = ["SentinelSet"]

MASTER = "prq-test"
#: Bounds: the set-up starting, and a failover.
START_S = 30.0
FAILOVER_S = 30.0


class SentinelSet:
    """A primary, a replica of it and a sentinel; `url` is the redis+sentinel:// URL."""

    def __init__(self) -> None:
        self.primary = EmbeddedRedis().start()
        self.replica = EmbeddedRedis(
            extra_args=["--replicaof", "127.0.0.1", str(self.primary.port)]
        ).start()
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="prq-sentinel-"))
        config = self.folder / "sentinel.conf"
        config.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.folder}\n"
            f"logfile {self.folder / 'sentinel.log'}\n"
            f"sentinel monitor {MASTER} 127.0.0.1 {self.primary.port} 1\n"
            f"sentinel down-after-milliseconds {MASTER} 1000\n"
            f"sentinel failover-timeout {MASTER} 5000\n"
        )
        self.process = subprocess.Popen(
            [find_server_binary(), str(config), "--sentinel"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        self.sentinel = redis.Redis(port=self.port, socket_timeout=2, decode_responses=True)
        wait_until(self._replica_known, START_S, 0.05, "the sentinel knows primary and replica")

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.port}/{MASTER}/0"

    def primary_port(self) -> int:
        _, port = self.sentinel.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)  # type: ignore[no-untyped-call]
        return int(port)

    def _replica_known(self) -> bool:
        try:
            replicas = self.sentinel.execute_command("SENTINEL", "REPLICAS", MASTER)  # type: ignore[no-untyped-call]
        except redis.RedisError:
            return False
        return any("s_down" not in str(r) for r in replicas) and len(replicas) >= 1

    def fail_over(self) -> int:
        """Ask the sentinel to promote the replica (it waits for it to catch up); the new
        primary's port once the sentinel names it."""
        before = self.primary_port()

        def asked() -> bool:  # refused (NOGOODSLAVE) until the sentinel has heard the replica
            try:
                self.sentinel.execute_command("SENTINEL", "FAILOVER", MASTER)  # type: ignore[no-untyped-call]
            except redis.ResponseError as exc:
                if "NOGOODSLAVE" in str(exc):
                    return False
                raise
            return True

        wait_until(asked, FAILOVER_S, 0.1, "the sentinel taking the failover")
        wait_until(lambda: self.primary_port() != before, FAILOVER_S, 0.05, "a new primary")
        return self.primary_port()

    def close(self) -> None:
        self.sentinel.close()
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.replica.cleanup()
        self.primary.cleanup()
