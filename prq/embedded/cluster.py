"""A private Redis Cluster on free loopback ports, for the demo, the benchmarks and the tests.

`masters` redis-server processes (and `replicas` per master), formed with CLUSTER commands: the
slots split evenly over the masters (CLUSTER ADDSLOTSRANGE), every node meets the first one
(CLUSTER MEET), each replica follows its master (CLUSTER REPLICATE); ready once every node says
`cluster_state:ok`, every master sees its replicas and every replica has finished its first
sync. Each node's cluster bus listens on a free port of its own (`--cluster-port`: by default
it is the port + 10000, which may be taken). Needs
redis-server 7 or later (ADDSLOTSRANGE, cluster-port); keeps nothing on disk.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType

import redis

from prq.core.errors import ConfigurationError
from prq.embedded import EmbeddedRedis, find_server_binary

__all__ = ["EmbeddedCluster", "form_cluster", "node_args", "server_version"]

SLOTS = 16384
#: How long forming the cluster may take.
FORM_TIMEOUT_S = 60.0
#: A node is judged failed (and its replica promoted) after this long unreachable.
DEFAULT_NODE_TIMEOUT_MS = 2000


def server_version(binary: str) -> tuple[int, int]:
    """(major, minor) of a redis-server binary; (0, 0) if it does not say."""
    out = subprocess.run(  # noqa: S603 (the configured server binary, no shell)
        [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
    )
    found = re.search(r"v=(\d+)\.(\d+)", out.stdout)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def node_args(node_timeout_ms: int = DEFAULT_NODE_TIMEOUT_MS) -> list[str]:
    """redis-server arguments of one cluster node, for an EmbeddedRedis made with
    `cluster_bus=True` (which chooses the bus's port)."""
    return [
        "--cluster-enabled", "yes",
        "--cluster-config-file", "nodes.conf",
        "--cluster-node-timeout", str(node_timeout_ms),
        # a replica's first full sync starts at once (not after the 5 s default wait)
        "--repl-diskless-sync-delay", "0",
    ]  # fmt: skip


def _bus_port(node: EmbeddedRedis) -> int:
    if node.bus_port is None:
        raise ConfigurationError(f"the node on port {node.port} was made without cluster_bus")
    return node.bus_port


def _wait(predicate: Callable[[], bool], what: str, timeout_s: float = FORM_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise ConfigurationError(f"the local cluster did not form in {timeout_s:g} s: {what}")
        time.sleep(0.05)


def form_cluster(
    masters: Sequence[EmbeddedRedis],
    replicas: Sequence[EmbeddedRedis],
    client: Callable[[EmbeddedRedis], redis.Redis],
) -> None:
    """Form a cluster of started nodes (`replicas` spread over the masters, in turn)."""
    nodes = [*masters, *replicas]
    share = SLOTS // len(masters)
    for i, master in enumerate(masters):
        last = SLOTS - 1 if i == len(masters) - 1 else (i + 1) * share - 1
        with client(master) as c:
            c.execute_command("CLUSTER", "ADDSLOTSRANGE", i * share, last)
    first = masters[0]
    for node in nodes[1:]:
        with client(node) as c:
            c.execute_command("CLUSTER", "MEET", "127.0.0.1", first.port, _bus_port(first))
    ids = {}
    for master in masters:
        with client(master) as c:
            ids[master.port] = str(c.execute_command("CLUSTER", "MYID"))

    _wait(lambda: _known_by_all(nodes, ids.values(), client), "every node knows every master")
    for i, replica in enumerate(replicas):
        _replicate(replica, ids[masters[i % len(masters)].port], client)
    wanted = {m.port: sum(1 for i in range(len(replicas)) if i % len(masters) == n)
              for n, m in enumerate(masters)}  # fmt: skip
    _wait(
        lambda: _ready(nodes, masters, wanted, client) and _synced(replicas, client),
        "the cluster ok with every replica attached and synced",
    )


def _replicate(
    replica: EmbeddedRedis, master_id: str, client: Callable[[EmbeddedRedis], redis.Redis]
) -> None:
    """CLUSTER REPLICATE, on a node formed fresh. A node that holds keys is refused ("must be
    empty and without assigned slots"). Seen once, in a fault test's formation, the cause not
    found: the node is emptied and asked again while the formation has time; refused still,
    the error says what it holds and what it says of itself."""
    deadline = time.monotonic() + FORM_TIMEOUT_S
    with client(replica) as c:
        while True:
            try:
                c.execute_command("CLUSTER", "REPLICATE", master_id)
                return
            except redis.ResponseError as exc:
                if "must be empty" not in str(exc) or time.monotonic() > deadline:
                    nodes = str(c.execute_command("CLUSTER", "NODES")).splitlines()
                    myself = next((line for line in nodes if "myself" in line), "?")
                    raise ConfigurationError(
                        f"the local cluster did not form: a replica refused its master "
                        f"({exc}); it holds {c.dbsize()} keys and says of itself: {myself}"
                    ) from exc
                c.flushall()
                time.sleep(0.05)


def _known_by_all(
    nodes: Sequence[EmbeddedRedis],
    ids: Iterable[str],
    client: Callable[[EmbeddedRedis], redis.Redis],
) -> bool:
    wanted = list(ids)
    for node in nodes:
        with client(node) as c:
            listed = str(c.execute_command("CLUSTER", "NODES"))
            if any(node_id not in listed for node_id in wanted):
                return False
    return True


def _ready(
    nodes: Sequence[EmbeddedRedis],
    masters: Sequence[EmbeddedRedis],
    replicas_of: dict[int, int],
    client: Callable[[EmbeddedRedis], redis.Redis],
) -> bool:
    for node in nodes:
        with client(node) as c:
            if "cluster_state:ok" not in str(c.execute_command("CLUSTER", "INFO")):
                return False
    for master in masters:
        with client(master) as c:
            if int(c.info("replication").get("connected_slaves", 0)) < replicas_of[master.port]:
                return False
    return True


def _synced(
    replicas: Sequence[EmbeddedRedis], client: Callable[[EmbeddedRedis], redis.Redis]
) -> bool:
    """Every replica has finished its first sync: until then it cannot be promoted (Redis
    judges a replica that never had a link to its master too stale to take over)."""
    for replica in replicas:
        with client(replica) as c:
            if c.info("replication").get("master_link_status") != "up":
                return False
    return True


class EmbeddedCluster:
    """A Redis Cluster of `masters` masters and `replicas` replicas of each, owned by this
    object; `url` is its redis+cluster:// URL (every master a seed).

    Example:
        with EmbeddedCluster() as cluster:
            queue = AsyncQueue.from_url(cluster.url)
    """

    def __init__(
        self,
        masters: int = 3,
        replicas: int = 0,
        *,
        binary: str | None = None,
        node_timeout_ms: int = DEFAULT_NODE_TIMEOUT_MS,
    ) -> None:
        if masters < 1 or replicas < 0:
            raise ValueError("a cluster needs at least one master, and replicas >= 0")
        self.binary = binary or find_server_binary()
        if server_version(self.binary) < (7, 0):
            raise ConfigurationError(
                f"a local cluster needs redis-server 7 or later; {self.binary} is older "
                "(apt-get install redis-server, or set PRQ_REDIS_SERVER)"
            )
        self.masters = [self._node(node_timeout_ms) for _ in range(masters)]
        self.replicas = [self._node(node_timeout_ms) for _ in range(masters * replicas)]

    def _node(self, node_timeout_ms: int) -> EmbeddedRedis:
        return EmbeddedRedis(
            binary=self.binary, extra_args=node_args(node_timeout_ms), cluster_bus=True
        )

    @property
    def nodes(self) -> list[EmbeddedRedis]:
        return [*self.masters, *self.replicas]

    @property
    def url(self) -> str:
        seeds = ",".join(f"127.0.0.1:{m.port}" for m in self.masters)
        return f"redis+cluster://{seeds}/0"

    @staticmethod
    def client(node: EmbeddedRedis) -> redis.Redis:
        """A plain client of one node (for its own commands: INFO, CLUSTER ...)."""
        return redis.Redis(port=node.port, socket_timeout=5, decode_responses=True)

    def start(self) -> EmbeddedCluster:
        try:
            for node in self.nodes:
                node.start()
            form_cluster(self.masters, self.replicas, self.client)
        except BaseException:
            self.cleanup()
            raise
        return self

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()
