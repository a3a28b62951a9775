"""A Redis Cluster for the suite, on free loopback ports: 3 masters and a replica of each,
formed by the suite itself with CLUSTER commands (no redis-cli needed), torn down after.

The slots are split evenly over the masters (CLUSTER ADDSLOTSRANGE), the nodes meet the first
one (CLUSTER MEET), each replica follows its master (CLUSTER REPLICATE), and the cluster is
ready once every node says `cluster_state:ok` and sees every replica.

With `acl_folder` every node loads the shipped users.acl (as `acl_server` does), the replicas
log in to their masters as its prq-replica user, and `url_for` names a user of it.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import redis
import redis.cluster

from prq.embedded import EmbeddedRedis, free_port
from tests.redis_servers import (
    TEST_ROOT_PASSWORD,
    TEST_ROOT_USER,
    acl_password,
    acl_server,
    redis7_binary,
    wait_until,
)

__all__ = ["ClusterSet"]

#: The shipped users.acl's user for replication.
REPLICA_USER = "prq-replica"

SLOTS = 16384
#: Bounds: forming the cluster; a node judged failed after this (cluster-node-timeout).
FORM_S = 60.0
NODE_TIMEOUT_MS = 2000


class ClusterSet:
    """`masters` masters with one replica each; `url` is a redis+cluster:// URL of a seed."""

    def __init__(self, masters: int = 3, acl_folder: Path | None = None) -> None:
        self.acl = acl_folder is not None
        self.masters = [self._node(acl_folder, f"master-{i}") for i in range(masters)]
        self.replicas = [self._node(acl_folder, f"replica-{i}") for i in range(masters)]
        try:
            for node in self.nodes:
                node.start()
            self._form()
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _node(acl_folder: Path | None, name: str) -> EmbeddedRedis:
        # The cluster bus on a free port of its own (by default port + 10000, which may be
        # taken, or past 65535)
        cluster_args = [
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            "--cluster-port", str(free_port()),
        ]  # fmt: skip
        if acl_folder is None:
            # (a bus port of its own, ADDSLOTSRANGE: Redis 7)
            return EmbeddedRedis(binary=redis7_binary()[0], extra_args=cluster_args)
        folder = acl_folder / name
        folder.mkdir(parents=True, exist_ok=True)
        node = acl_server(folder)
        node.extra_args += [
            *cluster_args,
            "--masteruser", REPLICA_USER, "--masterauth", acl_password(REPLICA_USER),
        ]  # fmt: skip
        return node

    @staticmethod
    def bus_port(node: EmbeddedRedis) -> int:
        return int(node.extra_args[node.extra_args.index("--cluster-port") + 1])

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

    def _form(self) -> None:
        share = SLOTS // len(self.masters)
        for i, master in enumerate(self.masters):
            last = SLOTS - 1 if i == len(self.masters) - 1 else (i + 1) * share - 1
            with self.client(master) as c:
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", i * share, last)
        first = self.masters[0]
        for node in self.nodes[1:]:
            with self.client(node) as c:
                c.execute_command("CLUSTER", "MEET", "127.0.0.1", first.port, self.bus_port(first))
        ids = {}
        for master in self.masters:
            with self.client(master) as c:
                ids[master.port] = c.execute_command("CLUSTER", "MYID")

        def known_by_all() -> bool:
            for node in self.nodes:
                with self.client(node) as c:
                    listed = c.execute_command("CLUSTER", "NODES")
                    if any(node_id not in str(listed) for node_id in ids.values()):
                        return False
            return True

        wait_until(known_by_all, FORM_S, 0.05, "every node knows every master")
        for master, replica in zip(self.masters, self.replicas, strict=True):
            with self.client(replica) as c:
                c.execute_command("CLUSTER", "REPLICATE", ids[master.port])
        wait_until(self._ready, FORM_S, 0.05, "the cluster ok with every replica attached")

    def _ready(self) -> bool:
        for node in self.nodes:
            with self.client(node) as c:
                info = c.execute_command("CLUSTER", "INFO")
                if "cluster_state:ok" not in str(info):
                    return False
        for master in self.masters:
            with self.client(master) as c:
                if int(c.info("replication").get("connected_slaves", 0)) < 1:
                    return False
        return True

    def close(self) -> None:
        for node in self.nodes:
            node.cleanup()
