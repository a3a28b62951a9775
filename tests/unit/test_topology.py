"""Where Redis is, by URL (prq.transport.topology): one server, a Sentinel-managed primary, or a
cluster; what is malformed or not supported is refused at once with ConfigurationError."""

from __future__ import annotations

import pytest
import redis.asyncio.retry
from redis.backoff import NoBackoff
from redis.retry import Retry

from prq import ConfigurationError, RedisSettings
from prq.transport.client_options import asyncio_kwargs, client_kwargs
from prq.transport.topology import Location, async_client, locate


def test_a_server_url_is_left_as_given() -> None:
    assert locate("redis://user:pw@host:6380/2") == Location(url="redis://user:pw@host:6380/2")
    assert not locate("rediss://host:6380/0").sentinel


def test_a_sentinel_url_names_the_sentinels_the_master_and_the_database() -> None:
    where = locate("redis+sentinel://app:s%40cret@s1:26380,s2,10.0.0.3:26381/main%20one/3")
    assert where.sentinels == (("s1", 26380), ("s2", 26379), ("10.0.0.3", 26381))
    assert (where.master, where.db, where.username, where.password) == (
        "main one",
        3,
        "app",
        "s@cret",
    )
    assert not where.tls and where.sentinel
    tls = locate("rediss+sentinel://s1/main")
    assert (tls.tls, tls.db, tls.username, tls.password) == (True, 0, None, None)
    assert RedisSettings(url="rediss+sentinel://s1/main").tls


def test_a_cluster_url_names_its_seed_nodes() -> None:
    where = locate("redis+cluster://prq:pw%2F1@n1:7000,n2,10.0.0.3:7002/0")
    assert where.cluster_nodes == (("n1", 7000), ("n2", 6379), ("10.0.0.3", 7002))
    assert (where.username, where.password, where.tls) == ("prq", "pw/1", False)
    assert where.cluster and not where.sentinel
    assert locate("rediss+cluster://n1").tls
    assert RedisSettings(url="rediss+cluster://n1:7000").tls
    assert not locate("redis://n1").cluster


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+sentinel://", "names no sentinel"),
        ("redis+sentinel://s1:26379", "master name"),
        ("redis+sentinel://s1:26379/main/0/extra", "master name"),
        ("redis+sentinel://s1:port/main", "not a number"),
        ("redis+sentinel://s1/main/zero", "not a number"),
        ("redis+cluster://", "names no node"),
        ("redis+cluster://n1:7000/1", "database 0 only"),
        ("redis+cluster://n1:seven", "not a number"),
        ("redis+cluster://n1:7000/0?ssl_cert_reqs=none", "take no options"),
        ("http://host:6379/0", "is not a Redis URL"),
        ("host:6379", "is not a Redis URL"),
        ("redis:/host:6379", "is not a Redis URL"),
        ("redis://host:port/0", "malformed"),
        ("redis://host:6379/zero", "malformed"),
    ],
)
def test_a_malformed_or_unsupported_url_is_refused_at_once(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        locate(url)


def test_a_server_url_of_each_scheme_is_taken() -> None:
    for url in ("redis://h:6379/0", "redis://h", "rediss://h:6380/1/", "unix:///run/redis.sock"):
        assert locate(url) == Location(url=url)


def test_a_refused_url_never_shows_its_password() -> None:
    for url in ("redis://app:s3cr3t@host:port/0", "http://app:s3cr3t@host:6379/0"):
        with pytest.raises(ConfigurationError) as refused:
            locate(url)
        assert "s3cr3t" not in str(refused.value) and "***" in str(refused.value)


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:1/0", "redis+sentinel://127.0.0.1:1/main", "redis+cluster://127.0.0.1:1"],
)
def test_an_asyncio_client_is_built_with_the_asyncio_kind_of_no_retry(url: str) -> None:
    # (redis-py 8.2 warns when an asyncio client is given the blocking kind of retry policy,
    # and the suite makes every warning an error; nothing connects while a client is built)
    client = async_client(url, client_kwargs(RedisSettings(url=url)))
    retry = client.retry if hasattr(client, "retry") else client.get_retry()
    assert isinstance(retry, redis.asyncio.retry.Retry)
    assert asyncio_kwargs({"retry": Retry(NoBackoff(), 0)})["retry"].get_retries() == 0
