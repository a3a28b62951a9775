"""The suite's Redis Cluster test bed (tests/cluster_servers.py): it forms, spreads the slots
over its masters, and a cluster client reads and writes keys of every shard. prq itself does not
run on a cluster yet: a redis+cluster:// URL is refused at once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis.cluster

from prq import AsyncQueue, ConfigurationError, RedisSettings
from tests.cluster_servers import ClusterSet

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterSet]:
    servers = ClusterSet()
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


def test_prq_refuses_a_cluster_url_at_once(cluster: ClusterSet) -> None:
    with pytest.raises(ConfigurationError, match="not supported yet"):
        AsyncQueue(RedisSettings(url=cluster.url))
