"""`/health`: no auth; ok with Redis; "degraded" when Redis evicts keys; 503 "down" (fast) when
Redis is gone, ok again after."""

from __future__ import annotations

import time

import httpx
import pytest
import redis

from prq import QueueSettings
from prq.embedded import EmbeddedRedis, free_port
from tests.api.conftest import QUEUE_SETTINGS, MakeApi
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration


async def test_health_is_ok_without_a_token(http: httpx.AsyncClient) -> None:
    # When health is asked without any credentials
    response = await http.get("/health")

    # Then Redis is reported up, with its version, and the service's own identity
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "ok"
    assert body["redis"]["ok"] is True and body["redis"]["version"]
    assert body["redis"]["warnings"] == []
    assert body["redis"]["maxmemory_policy"] == "noeviction"
    assert body["data_loss_events"] == 0
    assert body["node_id"] and body["version"]


async def test_health_is_down_while_redis_is_dead(
    make_api: MakeApi, own_redis: EmbeddedRedis
) -> None:
    # Given the service on a Redis of the test's own, with short bounds
    queue_settings = QueueSettings(**{**QUEUE_SETTINGS.model_dump(), "retry_budget_s": 1.0})
    api = make_api(own_redis.url, queue_settings=queue_settings, redis_timeout_s=2.0)
    async with httpx.AsyncClient(base_url=api.url, timeout=15) as http:
        assert (await http.get("/health")).json()["status"] == "ok"

        # When Redis dies
        own_redis.kill()
        started = time.monotonic()
        response = await http.get("/health")
        elapsed = time.monotonic() - started

        # Then health answers 503 "down" within the Redis bound, without Redis's details
        assert response.status_code == 503, response.text
        body = response.json()
        assert body["status"] == "down" and body["redis"]["ok"] is False
        assert body["redis"]["error"] == "Redis did not answer"
        assert str(own_redis.port) not in response.text
        assert elapsed < 2.0 + 1.0

        # And once Redis is back (empty), health is ok again and counts the data loss
        own_redis.start()

        async def healthy_after_loss() -> bool:
            response = await http.get("/health")
            return response.status_code == 200 and response.json()["data_loss_events"] >= 1

        await async_wait_until(healthy_after_loss, 15, 0.1, "health ok, data loss counted")


async def test_health_is_degraded_while_redis_evicts_keys(
    make_api: MakeApi, own_redis: EmbeddedRedis, own_redis_client: redis.Redis
) -> None:
    # Given the service on a Redis of the test's own, configured as prq wants
    api = make_api(own_redis.url)
    async with httpx.AsyncClient(base_url=api.url, timeout=15) as http:
        assert (await http.get("/health")).json()["status"] == "ok"

        # When that Redis is told to evict keys under memory pressure
        own_redis_client.config_set("maxmemory", "100mb")
        own_redis_client.config_set("maxmemory-policy", "allkeys-lru")
        response = await http.get("/health")

        # Then health still answers 200 (Redis is up) but says "degraded", and why
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["status"] == "degraded"
        assert body["redis"]["ok"] is True
        assert body["redis"]["maxmemory_policy"] == "allkeys-lru"
        [warning] = body["redis"]["warnings"]
        assert "Redis evicts keys under memory pressure (maxmemory-policy allkeys-lru)" in warning
        assert "set maxmemory-policy noeviction" in warning


async def test_the_service_starts_without_redis_and_says_down(
    make_api: MakeApi, admin: dict[str, str]
) -> None:
    # Given no Redis at the configured address when the service starts
    queue_settings = QueueSettings(**{**QUEUE_SETTINGS.model_dump(), "retry_budget_s": 0.5})
    api = make_api(
        f"redis://127.0.0.1:{free_port()}/0", queue_settings=queue_settings, redis_timeout_s=2.0
    )
    async with httpx.AsyncClient(base_url=api.url, timeout=15) as http:
        # When health is asked / Then it is down (503), and reads answer 503 too
        health = await http.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "down"
        assert health.json()["node_id"]
        endpoints = await http.get("/api/endpoints", headers=admin)
        assert endpoints.status_code == 503, endpoints.text
        assert endpoints.json()["error"]["type"] == "queue_unavailable"
        assert "127.0.0.1" not in endpoints.text
