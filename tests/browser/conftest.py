"""Browser test bed: the admin service on a real uvicorn, callers waiting in its queue, Chromium.

- `admin_service` (module): `api.app.create_app` on the shared Redis under a fresh key prefix,
  served by uvicorn in a thread on a free loopback port (`tests.api.servers.ApiServer`), with
  one admin and one read token.
- `callers`: `callers.call(endpoint, ...)` sends a request from a blocking `prq.Queue` in a
  worker thread and returns its id; no receiver serves these endpoints, so the requests stay
  queued. `callers.outcome(id)` waits (bounded) for what the caller got. Teardown cancels what
  still waits and closes the queue.
- `browser` (module): the Debian Chromium at /usr/bin/chromium driven by Playwright (never a
  downloaded browser). Missing → the test fails and says to run `make browser`, or skips when
  PRQ_SKIP_BROWSER=1.
- `page`: a fresh browser context (its own sessionStorage) and page; an uncaught script error or
  a Content-Security-Policy violation in the page fails the test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, sync_playwright
from pydantic import SecretStr

from api.app import create_app
from api.settings import ApiSettings
from tests.api.servers import ApiServer
from tests.browser.support import AdminService, Callers
from tests.redis_servers import delete_prefix, new_prefix, url_client

#: Debian's Chromium (packages `chromium` and `chromium-driver`, installed by `make browser`).
CHROMIUM = "/usr/bin/chromium"
#: Set to 1 to skip the browser tests on a machine without Chromium (instead of failing).
SKIP_ENV = "PRQ_SKIP_BROWSER"
#: Headless, sandbox-free (containers), and quiet: no network calls of the browser's own.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ADMIN_TOKEN = "dash-admin-token-0123456789abcdef"
READ_TOKEN = "dash-read-token-0123456789abcdef"


@pytest.fixture(scope="module")
def admin_service(redis_url: str, redis_admin_url: str) -> Iterator[AdminService]:
    """The real admin app on a fresh prefix, sampling throughput often (the chart fills fast)."""
    prefix = new_prefix()
    settings = ApiSettings(
        admin_tokens=[SecretStr(ADMIN_TOKEN)],
        read_tokens=[SecretStr(READ_TOKEN)],
        sample_interval_s=0.25,
    )
    app = create_app(settings, redis_url=redis_url, prefix=prefix)
    try:
        with ApiServer(app) as server:
            yield AdminService(server.url, prefix, ADMIN_TOKEN, READ_TOKEN)
    finally:
        client = url_client(redis_admin_url)
        try:
            delete_prefix(client, prefix)
        finally:
            client.close()


@pytest.fixture
def callers(redis_url: str, admin_service: AdminService) -> Iterator[Callers]:
    made = Callers(redis_url, admin_service.prefix)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not os.path.exists(CHROMIUM):
        message = f"{CHROMIUM} is missing: run `make browser` (Debian chromium, chromium-driver)"
        if os.environ.get(SKIP_ENV) == "1":
            pytest.skip(message)
        pytest.fail(f"{message}, or set {SKIP_ENV}=1 to skip the browser tests")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    problems: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text:
            problems.append(message.text)

    opened.on("pageerror", lambda error: problems.append(f"uncaught: {error}"))
    opened.on("console", on_console)
    try:
        yield opened
    finally:
        context.close()
    assert not problems, f"errors in the page: {problems}"
