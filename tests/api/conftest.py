"""Fixtures of the admin-service tests: a real Redis, the app under uvicorn, an HTTP client.

- `tokens`: an admin and a read token, fresh for every test session (random, so a leak test
  can search logs and bodies for them).
- `make_api(url=None, queue_settings=..., **api_settings)`: starts the admin service for the
  test's key prefix on the shared Redis (or on `url`) under uvicorn on loopback; stopped at
  teardown.
- `api`: one such service with the default test settings.
- `http`: an `httpx.AsyncClient` on `api` without credentials; `admin` / `read` are the
  `Authorization` headers of the two roles.
- `sender`: an `AsyncQueue` node on the same prefix, to enqueue requests the API can see.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from api import ApiSettings, create_app
from prq import AsyncQueue, QueueSettings
from tests.api.servers import ApiServer
from tests.queue_facades import FAST_SETTINGS

#: Queue timings for the app's node and the tests' nodes: endpoints are reported to the
#: registry every 0.2 s (so the API lists them at once), and nothing is picked up by itself.
QUEUE_SETTINGS = QueueSettings(
    **{**FAST_SETTINGS, "pickup_timeout_s": 30.0, "data_loss_check_interval_s": 0.2}
)
#: Admin-service settings for tests: fast sampling, a short Redis bound.
API_DEFAULTS: dict[str, Any] = {"sample_interval_s": 0.1, "redis_timeout_s": 3.0}
#: Bound of one HTTP call in a test.
HTTP_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Tokens:
    admin: str
    read: str

    @property
    def admin_header(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin}"}

    @property
    def read_header(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.read}"}


@pytest.fixture(scope="session")
def tokens() -> Tokens:
    return Tokens(admin=f"adm-{secrets.token_urlsafe(24)}", read=f"rd-{secrets.token_urlsafe(24)}")


MakeApi = Callable[..., ApiServer]


@pytest.fixture
def make_api(redis_url: str, key_prefix: str, tokens: Tokens) -> Iterator[MakeApi]:
    """Factory of running admin services (stopped, bounded, at teardown)."""
    running: list[ApiServer] = []

    def make(
        url: str | None = None,
        queue_settings: QueueSettings = QUEUE_SETTINGS,
        **overrides: Any,
    ) -> ApiServer:
        settings = ApiSettings(
            admin_tokens=[tokens.admin],
            read_tokens=[tokens.read],
            **{**API_DEFAULTS, **overrides},
        )
        app = create_app(
            settings,
            redis_url=url or redis_url,
            prefix=key_prefix,
            queue_settings=queue_settings,
        )
        server = ApiServer(app).__enter__()
        running.append(server)
        return server

    try:
        yield make
    finally:
        for server in reversed(running):
            server.__exit__(None, None, None)


@pytest.fixture
def api(make_api: MakeApi) -> ApiServer:
    return make_api()


@pytest.fixture
async def http(api: ApiServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api.url, timeout=HTTP_TIMEOUT_S) as client:
        yield client


@pytest.fixture
def admin(tokens: Tokens) -> dict[str, str]:
    return tokens.admin_header


@pytest.fixture
def read(tokens: Tokens) -> dict[str, str]:
    return tokens.read_header


@pytest.fixture
async def sender(redis_url: str, key_prefix: str) -> AsyncIterator[AsyncQueue]:
    queue = AsyncQueue.from_url(redis_url, prefix=key_prefix, settings=QUEUE_SETTINGS)
    await queue.start()
    try:
        yield queue
    finally:
        await queue.aclose()
