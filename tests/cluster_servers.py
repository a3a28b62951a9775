"""A Redis Cluster for the suite, on free loopback ports: 3 masters and a replica of each,
formed by the suite itself with CLUSTER commands (prq.embedded.cluster.form_cluster; no
redis-cli needed), torn down after.

With `acl_folder` every node loads the shipped users.acl (as `acl_server` does), the replicas
log in to their masters as its prq-replica user, and `url_for` names a user of it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from urllib.parse import quote

import redis
import redis.cluster

from prq.core.errors import ConfigurationError
from prq.embedded import EmbeddedRedis
from prq.embedded.cluster import form_cluster, node_args
from tests.redis_servers import (
    TEST_ROOT_PASSWORD,
    TEST_ROOT_USER,
    acl_password,
    acl_server,
    redis7_binary,
    wait_until,
)

__all__ = ["ClusterSet"]

logger = logging.getLogger(__name__)

#: The shipped users.acl's user for replication.
REPLICA_USER = "prq-replica"

#: A node judged failed after this (cluster-node-timeout).
NODE_TIMEOUT_MS = 2000
#: Formations tried (fresh nodes each) before the bed gives up.
FORM_ATTEMPTS = 2


class ClusterSet:
    """`masters` masters with one replica each; `url` is a redis+cluster:// URL of a seed."""

    def __init__(self, masters: int = 3, acl_folder: Path | None = None) -> None:
        self.acl = acl_folder is not None
        for attempt in range(1, FORM_ATTEMPTS + 1):
            self.masters = [self._node(acl_folder, f"master-{i}", attempt) for i in range(masters)]
            self.replicas = [
                self._node(acl_folder, f"replica-{i}", attempt) for i in range(masters)
            ]
            try:
                for node in self.nodes:
                    node.start()
                self._form()
                return
            except ConfigurationError as exc:
                # (a formation that does not finish in time: seen once, on a loaded machine,
                # failing a whole pass; what the nodes said is kept for the next look)
                report = self.report()
                self.close()
                if attempt == FORM_ATTEMPTS:
                    raise ConfigurationError(f"{exc}; what each node said:\n{report}") from exc
                logger.warning(
                    "cluster formation attempt %d failed (%s); nodes:\n%s", attempt, exc, report
                )
            except BaseException:
                self.close()
                raise

    @staticmethod
    def _node(acl_folder: Path | None, name: str, attempt: int = 1) -> EmbeddedRedis:
        if acl_folder is None:
            # (a bus port of its own, ADDSLOTSRANGE: Redis 7)
            return EmbeddedRedis(
                binary=redis7_binary()[0], extra_args=node_args(NODE_TIMEOUT_MS), cluster_bus=True
            )
        folder = acl_folder / (name if attempt == 1 else f"{name}-{attempt}")
        folder.mkdir(parents=True, exist_ok=True)
        node = acl_server(folder, cluster_bus=True)
        node.extra_args += [
            *node_args(NODE_TIMEOUT_MS),
            "--masteruser", REPLICA_USER, "--masterauth", acl_password(REPLICA_USER),
        ]  # fmt: skip
        return node

    @property
    def nodes(self) -> list[EmbeddedRedis]:
        return [*self.masters, *self.replicas]

    @property
    def url(self) -> str:
        """A redis+cluster:// URL with one seed (as the tests' superuser, with an ACL)."""
        if self.acl:
            return self.url_for(TEST_ROOT_USER, TEST_ROOT_PASSWORD)
        return f"redis+cluster://127.0.0.1:{self.masters[0].port}/0"

    def url_for(self, username: str, password: str) -> str:
        """A redis+cluster:// URL naming every master as a seed, as `username`."""
        seeds = ",".join(f"127.0.0.1:{m.port}" for m in self.masters)
        return f"redis+cluster://{quote(username, safe='')}:{quote(password, safe='')}@{seeds}/0"

    def cluster_client(self) -> redis.cluster.RedisCluster:
        """A redis-py cluster client (as the tests' superuser, with an ACL)."""
        return redis.cluster.RedisCluster(
            startup_nodes=[redis.cluster.ClusterNode("127.0.0.1", m.port) for m in self.masters],  # type: ignore[no-untyped-call]
            username=TEST_ROOT_USER if self.acl else None,
            password=TEST_ROOT_PASSWORD if self.acl else None,
            socket_timeout=10,
        )

    def client(self, node: EmbeddedRedis) -> redis.Redis:
        return redis.Redis(
            port=node.port, socket_timeout=5, decode_responses=True,
            username=TEST_ROOT_USER if self.acl else None,
            password=TEST_ROOT_PASSWORD if self.acl else None,
        )  # fmt: skip

    def add_master(self) -> EmbeddedRedis:
        """Start an empty node, have the cluster meet it (it serves no slot yet), and count it
        among the masters once every node knows it."""
        assert not self.acl, "a node added to an ACL cluster would need its users too"
        node = self._node(None, f"master-{len(self.masters)}")
        node.start()
        self.masters.append(node)
        bus = node.bus_port
        with self.client(self.masters[0]) as c:
            c.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, bus)

        def known_everywhere() -> bool:
            for other in [*self.masters, *self.replicas]:
                with self.client(other) as c:
                    if f"127.0.0.1:{node.port}@" not in c.execute_command("CLUSTER", "NODES"):
                        return False
            with self.client(node) as c:  # and it learned who serves every slot
                return "cluster_state:ok" in c.execute_command("CLUSTER", "INFO")

        wait_until(known_everywhere, 20, 0.1, "the new node known to every node, and ready")
        return node

    def report(self) -> str:
        """What each live node says of the cluster (CLUSTER NODES, and its log's last lines):
        what a test prints when the cluster did not do what it waited for."""
        parts = []
        for node in self.nodes:
            if node.process is None or node.process.poll() is not None:
                parts.append(f"-- {node.port}: not running")
                continue
            try:
                with self.client(node) as c:
                    nodes = c.execute_command("CLUSTER", "NODES")
            except redis.RedisError as exc:
                nodes = f"(no answer: {exc})"
            log = node.data_dir / "redis.log"
            tail = log.read_text(errors="replace").splitlines()[-25:] if log.exists() else []
            parts.append(f"-- {node.port}:\n{nodes}\n" + "\n".join(tail))
        return "\n".join(parts)

    def _form(self) -> None:
        form_cluster(self.masters, self.replicas, self.client)

    def close(self) -> None:
        for node in self.nodes:
            node.cleanup()
