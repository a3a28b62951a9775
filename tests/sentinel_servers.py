"""A Sentinel set-up for the suite, on free loopback ports: a primary, a replica and three
sentinels watching them (quorum 2, a primary judged down after 1 s), all started by the suite,
so a test can fail the primary over. With an ACL folder the data nodes load the shipped
users.acl (as `acl_server` does), and the replica and the sentinels log in as its prq-replica
and prq-sentinel users: a failover then proves those users' rights enough.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from urllib.parse import quote

import redis

from prq.embedded import EmbeddedRedis, find_server_binary, free_port
from tests.fault.proxy import FaultProxy
from tests.redis_servers import acl_password, acl_server, wait_until

__all__ = ["SentinelSet"]

MASTER = "prq-test"
#: The shipped users.acl's users for a replica and for the sentinels.
REPLICA_USER, SENTINEL_USER = "prq-replica", "prq-sentinel"
SENTINELS = 3
QUORUM = 2
#: Bounds: the set-up starting, and a failover.
START_S = 30.0
FAILOVER_S = 30.0


class SentinelSet:
    """A primary, a replica of it and three sentinels; `url` is the redis+sentinel:// URL."""

    def __init__(self, acl_folder: Path | None = None, *, freezable: bool = False) -> None:
        """`freezable`: the replica replicates through a fault proxy that `freeze` stops, so a
        failover can promote a replica that missed writes."""
        self.folder = Path(tempfile.mkdtemp(prefix="prq-sentinel-"))
        self.primary = self._data_node(acl_folder, "primary", ["--repl-diskless-sync-delay", "0"])
        self.primary.start()
        self.link: FaultProxy | None = None
        upstream = self.primary.port
        if freezable:
            self.link = FaultProxy(self.primary.port, parse_resp=False, name="replication-link")
            upstream = self.link.port
        replica_of = ["--replicaof", "127.0.0.1", str(upstream), "--repl-timeout", "3600"]
        if acl_folder is not None:  # as the shipped users.acl's replication user
            replica_of += ["--masteruser", REPLICA_USER, "--masterauth", acl_password(REPLICA_USER)]
        self.replica = self._data_node(acl_folder, "replica", replica_of)
        self.replica.start()
        auth = acl_folder is not None
        self.ports = [free_port() for _ in range(SENTINELS)]
        self.processes = [self._sentinel(port, auth) for port in self.ports]
        self.sentinel = redis.Redis(port=self.ports[0], socket_timeout=2, decode_responses=True)
        try:
            wait_until(self._ready, START_S, 0.05, "the sentinels know the primary and replica")
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _data_node(acl_folder: Path | None, name: str, extra: list[str]) -> EmbeddedRedis:
        if acl_folder is None:
            return EmbeddedRedis(extra_args=extra)
        folder = acl_folder / name
        folder.mkdir(parents=True, exist_ok=True)
        node = acl_server(folder)
        node.extra_args += extra
        return node

    def _sentinel(self, port: int, auth: bool) -> subprocess.Popen[bytes]:
        folder = self.folder / str(port)
        folder.mkdir()
        lines = [
            f"port {port}", "bind 127.0.0.1", f"dir {folder}",
            f"logfile {folder / 'sentinel.log'}",
            f"sentinel monitor {MASTER} 127.0.0.1 {self.primary.port} {QUORUM}",
            f"sentinel down-after-milliseconds {MASTER} 1000",
            f"sentinel failover-timeout {MASTER} 5000",
        ]  # fmt: skip
        if auth:  # as the shipped users.acl's sentinel user
            lines += [
                f"sentinel auth-user {MASTER} {SENTINEL_USER}",
                f"sentinel auth-pass {MASTER} {acl_password(SENTINEL_USER)}",
            ]
        config = folder / "sentinel.conf"
        config.write_text("\n".join(lines) + "\n")
        return subprocess.Popen(
            [find_server_binary(), str(config), "--sentinel"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip

    def url_for(self, username: str | None = None, password: str | None = None) -> str:
        """The redis+sentinel:// URL, logging in to the data nodes as `username`."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        login = ""
        if password is not None:
            login = f"{quote(username or 'default', safe='')}:{quote(password, safe='')}@"
        return f"redis+sentinel://{login}{hosts}/{MASTER}/0"

    @property
    def url(self) -> str:
        return self.url_for(self.primary.username, self.primary.password)

    def primary_port(self) -> int:
        _, port = self.sentinel.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)  # type: ignore[no-untyped-call]
        return int(port)

    def _ready(self) -> bool:
        """Every sentinel knows the primary, the replica and the other sentinels, and the
        replica has finished its first sync (a replica that never synced is not promoted)."""
        try:
            with redis.Redis(
                port=self.replica.port, socket_timeout=2, decode_responses=True,
                username=self.replica.username, password=self.replica.password,
            ) as replica:  # fmt: skip
                if replica.info("replication").get("master_link_status") != "up":
                    return False
            for port in self.ports:
                with redis.Redis(port=port, socket_timeout=2, decode_responses=True) as one:
                    fields = one.sentinel_master(MASTER)
                    if int(fields["num-slaves"]) < 1 or int(fields["num-other-sentinels"]) < 2:
                        return False
        except redis.RedisError:
            return False
        return True

    def freeze(self) -> None:
        """Stop replication silently (the link holds every byte): the replica goes stale."""
        assert self.link is not None, "a freezable set-up"
        self.link.blackhole()

    def crash_primary(self) -> int:
        """kill -9 the primary; the sentinels then promote the replica. Its port, once they
        name it."""
        before = self.primary_port()
        self.primary.kill()
        wait_until(lambda: self.primary_port() != before, FAILOVER_S, 0.05, "a new primary")
        if self.link is not None:
            self.link.cut()  # the held replication bytes must never arrive now
        return self.primary_port()

    def fail_over(self) -> int:
        """Ask a sentinel to promote the replica (it waits for it to catch up); the new
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
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        if self.link is not None:
            self.link.close()
        self.replica.cleanup()
        self.primary.cleanup()
