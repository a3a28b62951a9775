"""The dashboard in a real headless Chromium against the real admin service and Redis.

Requests wait in queues nobody serves; the page must show them, escape what the endpoint name
holds, cancel one for an admin (its caller gets CancelledBeforePickup), and offer no Cancel to a
read-only token. An endpoint's priorities panel shows what waits at each priority, highest
first. Its limits panel shows its capacity limits, with a form to set them
for an admin only; its dead-letter panel lists them as text, with Replay and a confirmed Purge
all for an admin only. A body too large for a listing to read shows its size and says so.
Screenshots land in test-output/ (dashboard.png, and
dashboard-dead-letters.png) for people to look at.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Locator, Page, expect

from prq import CancelledBeforePickup, Queue, RedisSettings, RequestState
from prq.core.keys import KeySchema, encode_endpoint
from prq.protocol.dead import BODY_READ_MAX_BYTES, PREVIEW_BYTES
from tests.browser.support import AdminService, Callers
from tests.redis_servers import url_client

pytestmark = pytest.mark.integration

#: Bound of every wait on the page, ms (the page refreshes every 2 s).
EXPECT_MS = 10_000
#: Where the screenshot goes: test-output/ under the repository root (ignored by git).
SCREENSHOT = Path(__file__).resolve().parents[2] / "test-output" / "dashboard.png"
#: The endpoint view with its dead-letter panel, as an admin sees it.
DEAD_LETTERS_SCREENSHOT = SCREENSHOT.with_name("dashboard-dead-letters.png")
#: An endpoint name with markup in it: shown as typed, never run or parsed.
EVIL_ENDPOINT = 'poll://dash/<script>window.__pwned=1</script><b>&amp;"bold"</b>'
TOKEN_KEY = "prq.dashboard.token"
#: A body no listing reads (prq.protocol.dead.BODY_READ_MAX_BYTES), and what the page shows instead.
LARGE_BODY = 3 * BODY_READ_MAX_BYTES
NOT_READ = "(body too large to read here)"
#: A number above zero, as an attribute holds it.
POSITIVE = re.compile(r"^(?!0(?:\.0*)?$)[0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?$")


def endpoint_row(page: Page, endpoint: str) -> Locator:
    link = page.get_by_test_id("endpoint-link").get_by_text(endpoint, exact=True)
    return page.get_by_test_id("endpoint-row").filter(has=link)


def open_dashboard(page: Page, service: AdminService, token: str) -> None:
    page.goto(f"{service.url}/dashboard#token={token}")
    # The token left the address bar and sits in this tab's session storage.
    expect(page).to_have_url(f"{service.url}/dashboard", timeout=EXPECT_MS)
    expect(page.get_by_test_id("dashboard")).to_be_visible(timeout=EXPECT_MS)
    assert page.evaluate(f"sessionStorage.getItem('{TOKEN_KEY}')") == token


def test_admin_sees_queued_requests_and_cancels_one(
    page: Page, admin_service: AdminService, callers: Callers
) -> None:
    # Given three requests waiting on an endpoint whose name holds markup, one on another
    ids = [
        callers.call(EVIL_ENDPOINT, "resize", producer="batch<i>", priority=p) for p in (0, 1, 5)
    ]
    callers.call("poll://dash/billing", "charge", producer="shop")

    # When an admin opens the dashboard with the token in the fragment
    open_dashboard(page, admin_service, admin_service.admin_token)

    # Then the role, the health banner and the endpoint with its depth show
    expect(page.get_by_test_id("role")).to_have_text("admin", timeout=EXPECT_MS)
    health_state = page.get_by_test_id("health-state")
    expect(health_state).to_have_text(re.compile(r"^(ok|degraded)$"), timeout=EXPECT_MS)
    row = endpoint_row(page, EVIL_ENDPOINT)
    expect(row.get_by_test_id("endpoint-depth")).to_have_text("3", timeout=EXPECT_MS)
    expect(row.get_by_test_id("endpoint-in-flight")).to_have_text("0")
    expect(endpoint_row(page, "poll://dash/billing").get_by_test_id("endpoint-depth")).to_have_text(
        "1"
    )
    # ... and the markup in the name stayed text: no script ran, no element was made of it
    assert page.evaluate("window.__pwned") is None
    assert page.locator("script").count() == 1  # the dashboard's own module
    assert page.locator("b").count() == 0

    # When two more requests arrive on the listed billing endpoint
    for _ in range(2):
        callers.call("poll://dash/billing", "charge", producer="shop")

    # Then the throughput chart draws a rise in billing's enqueue rate
    billing_line = page.locator(
        '[data-testid=throughput-svg] [data-endpoint="poll://dash/billing"]'
    )
    expect(billing_line).to_have_attribute("data-peak", POSITIVE, timeout=EXPECT_MS)

    # When the admin clicks the endpoint
    row.get_by_test_id("endpoint-link").click()

    # Then its queued requests show, each with a Cancel button
    expect(page.get_by_test_id("queued-endpoint")).to_have_text(EVIL_ENDPOINT, timeout=EXPECT_MS)
    queued = page.get_by_test_id("queued-row")
    expect(queued).to_have_count(3, timeout=EXPECT_MS)
    assert sorted(queued.get_by_test_id("queued-id").all_inner_texts()) == sorted(ids)
    expect(queued.first.get_by_test_id("queued-producer")).to_have_text("batch<i>")
    expect(page.get_by_test_id("cancel-button")).to_have_count(3)
    # ... and the chart's legend names it (as text)
    series = page.get_by_test_id("throughput-series").filter(has_text=EVIL_ENDPOINT)
    expect(series).to_be_visible(timeout=EXPECT_MS)

    SCREENSHOT.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)

    # When the admin cancels the middle request
    victim = ids[1]
    page.get_by_role("button", name=f"Cancel request {victim}").click()

    # Then the page says so, and the request leaves the list and the depth
    expect(page.get_by_test_id("status")).to_have_text(
        f"Cancelled request {victim}.", timeout=EXPECT_MS
    )
    expect(page.get_by_test_id("cancel-button")).to_have_count(2, timeout=EXPECT_MS)
    assert sorted(queued.get_by_test_id("queued-id").all_inner_texts()) == sorted(ids[::2])
    expect(row.get_by_test_id("endpoint-depth")).to_have_text("2", timeout=EXPECT_MS)
    # ... its caller got prq's Cancelled error, and its status says it was cancelled
    assert isinstance(callers.outcome(victim), CancelledBeforePickup)
    status = callers.queue.status(victim)
    assert (status.state, status.reason) == (RequestState.WITHDRAWN, "cancelled")
    headers = {"Authorization": f"Bearer {admin_service.read_token}"}
    with httpx.Client(base_url=admin_service.url, headers=headers, timeout=10) as client:
        answer = client.get(f"/api/requests/{victim}")
    assert answer.status_code == 200, answer.text
    assert (answer.json()["state"], answer.json()["reason"]) == ("withdrawn", "cancelled")
    # ... while the other callers still wait
    assert callers.queue.status(ids[0]).state == RequestState.QUEUED


def test_read_only_token_sees_queued_requests_without_cancel(
    page: Page, admin_service: AdminService, callers: Callers
) -> None:
    # Given a waiting request
    endpoint = "poll://dash/read-only"
    request_id = callers.call(endpoint, "lookup", producer="reports")

    # When a read-only user opens the dashboard and the endpoint
    open_dashboard(page, admin_service, admin_service.read_token)
    expect(page.get_by_test_id("role")).to_have_text("read-only", timeout=EXPECT_MS)
    endpoint_row(page, endpoint).get_by_test_id("endpoint-link").click()

    # Then the request shows, with no Cancel button and no action column
    queued = page.get_by_test_id("queued-row")
    expect(queued.get_by_test_id("queued-id")).to_have_text([request_id], timeout=EXPECT_MS)
    expect(page.get_by_test_id("cancel-button")).to_have_count(0)
    expect(page.get_by_role("columnheader", name="Action")).to_have_count(0)
    assert callers.queue.status(request_id).state == RequestState.QUEUED


def test_sign_in_form_rejects_a_bad_token_and_keeps_a_good_one(
    page: Page, admin_service: AdminService
) -> None:
    # Given the dashboard opened without a token
    page.goto(f"{admin_service.url}/dashboard")
    expect(page.get_by_test_id("signin")).to_be_visible(timeout=EXPECT_MS)
    expect(page.get_by_test_id("dashboard")).to_be_hidden()

    # When a wrong token is entered, Then the page says it was refused and stays on the form
    page.get_by_label("Access token").fill("not-a-valid-token-at-all")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_test_id("status")).to_contain_text("401", timeout=EXPECT_MS)
    expect(page.get_by_test_id("signin")).to_be_visible()

    # When the read token is entered, Then the dashboard opens, also after a reload
    page.get_by_label("Access token").fill(admin_service.read_token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_test_id("role")).to_have_text("read-only", timeout=EXPECT_MS)
    expect(page.get_by_test_id("status")).to_have_text("", timeout=EXPECT_MS)
    page.reload()
    expect(page.get_by_test_id("role")).to_have_text("read-only", timeout=EXPECT_MS)

    # When the user signs out, Then the token is forgotten
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_test_id("signin")).to_be_visible(timeout=EXPECT_MS)
    assert page.evaluate(f"sessionStorage.getItem('{TOKEN_KEY}')") is None


def stored_limits(redis_admin_url: str, service: AdminService, endpoint: str) -> dict[str, str]:
    """The endpoint's limits hash as Redis holds it, decoded."""
    client = url_client(redis_admin_url)
    try:
        raw: dict[bytes, bytes] = client.hgetall(  # type: ignore[assignment]
            KeySchema(service.prefix).endpoint(endpoint).limits
        )
    finally:
        client.close()
    return {k.decode(): v.decode() for k, v in raw.items()}


def test_admin_sets_the_limits_of_an_endpoint(
    page: Page, admin_service: AdminService, callers: Callers, redis_admin_url: str
) -> None:
    # Given a waiting request on an endpoint without limits
    endpoint = "poll://dash/limited"
    callers.call(endpoint, "work", producer="batch")

    # When an admin opens the endpoint
    open_dashboard(page, admin_service, admin_service.admin_token)
    endpoint_row(page, endpoint).get_by_test_id("endpoint-link").click()

    # Then its limits panel says there are none, and offers the form
    limits = page.get_by_test_id("limits")
    expect(limits.get_by_test_id("limit-max-in-flight")).to_have_text("none", timeout=EXPECT_MS)
    expect(limits.get_by_test_id("limit-max-pending")).to_have_text("none")
    expect(page.get_by_test_id("limits-form")).to_be_visible()

    # When a limit that is no whole number of 1 or more is entered, Then it is not sent
    page.get_by_test_id("limit-max-in-flight-input").fill("0")
    page.get_by_role("button", name="Set limits").click()
    expect(page.get_by_test_id("status")).to_contain_text("whole numbers", timeout=EXPECT_MS)
    assert stored_limits(redis_admin_url, admin_service, endpoint) == {}

    # When the admin sets max in flight to 3 and leaves max pending empty
    page.get_by_label("Max in flight").fill("3")
    page.get_by_label("Max pending").fill("")
    page.get_by_role("button", name="Set limits").click()

    # Then the page says so and the panel shows the new limits
    expect(page.get_by_test_id("status")).to_have_text(
        f"Limits of {endpoint} set: max in flight 3, max pending none.", timeout=EXPECT_MS
    )
    expect(limits.get_by_test_id("limit-max-in-flight")).to_have_text("3", timeout=EXPECT_MS)
    expect(limits.get_by_test_id("limit-max-pending")).to_have_text("none")
    # ... and Redis holds it, for every node to apply
    assert stored_limits(redis_admin_url, admin_service, endpoint) == {"mif": "3"}

    # When the page is reloaded and the endpoint opened again
    page.reload()
    expect(page.get_by_test_id("role")).to_have_text("admin", timeout=EXPECT_MS)
    endpoint_row(page, endpoint).get_by_test_id("endpoint-link").click()

    # Then the panel shows 3 still, and the form holds the current limits
    expect(limits.get_by_test_id("limit-max-in-flight")).to_have_text("3", timeout=EXPECT_MS)
    expect(page.get_by_test_id("limit-max-in-flight-input")).to_have_value("3")
    expect(page.get_by_test_id("limit-max-pending-input")).to_have_value("")


def test_read_only_token_sees_the_limits_without_the_form(
    page: Page, admin_service: AdminService, callers: Callers, redis_admin_url: str
) -> None:
    # Given an endpoint whose max pending an admin set through the API
    endpoint = "poll://dash/limited-read"
    callers.call(endpoint, "work", producer="batch")
    headers = {"Authorization": f"Bearer {admin_service.admin_token}"}
    with httpx.Client(base_url=admin_service.url, headers=headers, timeout=10) as client:
        answer = client.put(
            "/api/endpoint/limits", params={"endpoint": endpoint}, json={"max_pending": 5}
        )
    assert answer.status_code == 200, answer.text

    # When a read-only user opens the endpoint
    open_dashboard(page, admin_service, admin_service.read_token)
    expect(page.get_by_test_id("role")).to_have_text("read-only", timeout=EXPECT_MS)
    endpoint_row(page, endpoint).get_by_test_id("endpoint-link").click()

    # Then the limits show, with no form to change them
    limits = page.get_by_test_id("limits")
    expect(limits.get_by_test_id("limit-max-pending")).to_have_text("5", timeout=EXPECT_MS)
    expect(limits.get_by_test_id("limit-max-in-flight")).to_have_text("none")
    expect(page.get_by_test_id("limits-form")).to_be_hidden()
    expect(page.get_by_role("button", name="Set limits")).to_have_count(0)
    assert stored_limits(redis_admin_url, admin_service, endpoint) == {"mp": "5"}


def dead_row(page: Page, request_id: str) -> Locator:
    return page.get_by_test_id("dead-row").filter(
        has=page.get_by_test_id("dead-id").get_by_text(request_id, exact=True)
    )


def test_admin_replays_a_dead_letter_and_purges_the_rest(
    page: Page, admin_service: AdminService, callers: Callers, redis_url: str
) -> None:
    # Given a listed endpoint with two dead letters: a request of its own, and bytes with markup
    endpoint = "poll://dash/dead"
    callers.call(endpoint, "work", producer="batch")
    replayed = callers.dead_letter(redis_url, endpoint)
    hostile = b'<img src=x onerror="window.__deadPwned=1"><b>not bold</b>\xff'
    garbled = callers.dead_letter(redis_url, endpoint, hostile)

    # When an admin opens the endpoint
    open_dashboard(page, admin_service, admin_service.admin_token)
    row = endpoint_row(page, endpoint)
    expect(row.get_by_test_id("endpoint-dead-letters")).to_have_text("2", timeout=EXPECT_MS)
    row.get_by_test_id("endpoint-link").click()

    # Then the dead-letter panel lists both, newest first, with reason, attempts and size
    rows = page.get_by_test_id("dead-row")
    expect(rows.get_by_test_id("dead-id")).to_have_text([garbled, replayed], timeout=EXPECT_MS)
    expect(rows.get_by_test_id("dead-reason")).to_have_text(["attempts_exhausted"] * 2)
    expect(rows.get_by_test_id("dead-attempts")).to_have_text(["3", "3"])
    expect(dead_row(page, garbled).get_by_test_id("dead-size")).to_have_text(f"{len(hostile)} B")
    expect(dead_row(page, garbled).get_by_test_id("dead-time")).to_have_text(
        re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}$")
    )
    # ... and the stored bytes as text: the markup is shown, never made into elements
    preview = dead_row(page, garbled).get_by_test_id("dead-preview")
    expect(preview).to_contain_text('<img src=x onerror="window.__deadPwned=1"><b>not bold')
    assert page.locator("img").count() == 0 and page.locator("b").count() == 0
    assert page.evaluate("window.__deadPwned") is None
    expect(page.get_by_test_id("replay-button")).to_have_count(2)
    SCREENSHOT.parent.mkdir(exist_ok=True)
    page.get_by_test_id("queued").screenshot(path=str(DEAD_LETTERS_SCREENSHOT))

    # When the admin replays the request
    page.get_by_role("button", name=f"Replay dead letter {replayed}").click()

    # Then the page says so, it leaves the panel and is queued again (once)
    expect(page.get_by_test_id("status")).to_have_text(
        f"Replayed dead letter {replayed}: queued again.", timeout=EXPECT_MS
    )
    expect(rows.get_by_test_id("dead-id")).to_have_text([garbled], timeout=EXPECT_MS)
    expect(row.get_by_test_id("endpoint-dead-letters")).to_have_text("1", timeout=EXPECT_MS)
    assert callers.queue.status(replayed).state == RequestState.QUEUED
    queued = page.get_by_test_id("queued-row").get_by_test_id("queued-id")
    expect(queued.get_by_text(replayed, exact=True)).to_have_count(1, timeout=EXPECT_MS)

    # When the admin asks to purge all but keeps them at the confirmation, Then nothing goes
    page.get_by_role("button", name="Purge all").click()
    expect(page.get_by_test_id("dead-purge-question")).to_have_text(
        f"Drop every dead letter of {endpoint}?"
    )
    page.get_by_role("button", name="Keep them").click()
    expect(page.get_by_role("button", name="Purge all")).to_be_visible()
    expect(rows).to_have_count(1)
    assert [d.id for d in callers.queue.dead_letters(endpoint)] == [garbled]

    # When the admin confirms the purge
    page.get_by_role("button", name="Purge all").click()
    page.get_by_role("button", name="Yes, purge all").click()

    # Then the panel is empty and Redis holds no dead letters for the endpoint
    expect(page.get_by_test_id("status")).to_have_text(
        f"Purged 1 dead letter(s) of {endpoint}.", timeout=EXPECT_MS
    )
    expect(rows).to_have_count(0, timeout=EXPECT_MS)
    expect(page.get_by_test_id("dead-empty")).to_be_visible()
    expect(page.get_by_role("button", name="Purge all")).to_have_count(0)
    assert callers.queue.dead_letters(endpoint) == []
    assert callers.queue.status(replayed).state == RequestState.QUEUED


def test_read_only_token_sees_dead_letters_without_buttons(
    page: Page, admin_service: AdminService, callers: Callers, redis_url: str
) -> None:
    # Given a listed endpoint with a dead letter
    endpoint = "poll://dash/dead-read"
    callers.call(endpoint, "work", producer="batch")
    request_id = callers.dead_letter(redis_url, endpoint)

    # When a read-only user opens the endpoint
    open_dashboard(page, admin_service, admin_service.read_token)
    expect(page.get_by_test_id("role")).to_have_text("read-only", timeout=EXPECT_MS)
    endpoint_row(page, endpoint).get_by_test_id("endpoint-link").click()

    # Then the dead letter shows, with neither Replay nor Purge all
    rows = page.get_by_test_id("dead-row")
    expect(rows.get_by_test_id("dead-id")).to_have_text([request_id], timeout=EXPECT_MS)
    expect(page.get_by_test_id("replay-button")).to_have_count(0)
    expect(page.get_by_role("button", name="Purge all")).to_have_count(0)
    expect(page.get_by_role("button", name=re.compile("Replay"))).to_have_count(0)
    expect(page.get_by_test_id("dead-purge")).to_be_hidden()
    assert [d.id for d in callers.queue.dead_letters(endpoint)] == [request_id]


def test_bodies_too_large_for_a_listing_show_their_size_and_say_so(
    page: Page, admin_service: AdminService, callers: Callers, redis_url: str
) -> None:
    # Given a listed endpoint with a request whose body is too large for a listing to read,
    # a dead letter with such a body, and one whose body is longer than its preview
    endpoint = "poll://dash/large"
    callers.call(endpoint, "work", producer="batch")
    huge = callers.queue.notify(endpoint, "huge", "x" * LARGE_BODY)
    unread = callers.dead_letter(redis_url, endpoint, b"h" * LARGE_BODY)
    cut = callers.dead_letter(redis_url, endpoint, b"c" * (PREVIEW_BYTES + 1))

    # When a read-only user opens the endpoint
    open_dashboard(page, admin_service, admin_service.read_token)
    endpoint_row(page, endpoint).get_by_test_id("endpoint-link").click()

    # Then the large request shows its size and says its body was not read
    row = page.get_by_test_id("queued-row").filter(
        has=page.get_by_test_id("queued-id").get_by_text(huge, exact=True)
    )
    expect(row.get_by_test_id("queued-method")).to_have_text(NOT_READ, timeout=EXPECT_MS)
    expect(row.get_by_test_id("queued-size")).to_have_text("3.0 MiB")
    expect(row.get_by_test_id("queued-priority")).to_have_text("—")
    # And so does the large dead letter; the long one's preview says it was cut
    large_letter = dead_row(page, unread)
    expect(large_letter.get_by_test_id("dead-preview")).to_have_text(NOT_READ, timeout=EXPECT_MS)
    expect(large_letter.get_by_test_id("dead-size")).to_have_text("3.0 MiB")
    preview = dead_row(page, cut).get_by_test_id("dead-preview")
    expect(preview).to_have_text("c" * 80 + "…")
    expect(preview).to_have_attribute("title", "c" * PREVIEW_BYTES + "…")


def test_the_priorities_panel_shows_what_waits_at_each_priority(
    page: Page, admin_service: AdminService, callers: Callers
) -> None:
    # Given requests waiting on one endpoint at priorities 5 (1), 0 (3) and -2 (2)
    endpoint = "poll://dash/levels"
    for priority, count in ((0, 3), (-2, 2), (5, 1)):
        for _ in range(count):
            callers.call(endpoint, "work", producer="levels", priority=priority)

    # When a read-only user opens the dashboard and selects the endpoint
    open_dashboard(page, admin_service, admin_service.read_token)
    row = endpoint_row(page, endpoint)
    expect(row.get_by_test_id("endpoint-depth")).to_have_text("6", timeout=EXPECT_MS)
    row.get_by_test_id("endpoint-link").click()

    # Then the panel lists the levels highest first, with their counts and shares
    panel = page.get_by_test_id("priorities")
    levels = panel.get_by_test_id("priority-row")
    expect(levels).to_have_count(3, timeout=EXPECT_MS)
    assert levels.get_by_test_id("priority-level").all_inner_texts() == ["5", "0", "-2"]
    assert levels.get_by_test_id("priority-depth").all_inner_texts() == ["1", "3", "2"]
    assert levels.get_by_test_id("priority-share").all_inner_texts() == ["17%", "50%", "33%"]
    meters = levels.locator("meter")
    assert [float(m.get_attribute("value") or "nan") for m in meters.all()] == pytest.approx(
        [1 / 6, 3 / 6, 2 / 6]
    )
    expect(panel.get_by_test_id("priorities-empty")).to_be_hidden()
    expect(panel.get_by_test_id("priorities-more")).to_be_hidden()

    # When a request arrives at priority 9, it heads the panel at the next refresh
    top = callers.call(endpoint, "work", producer="levels", priority=9)
    expect(levels).to_have_count(4, timeout=EXPECT_MS)
    expect(levels.first.get_by_test_id("priority-level")).to_have_text("9")

    # When it is cancelled (through the API, by an admin)
    headers = {"Authorization": f"Bearer {admin_service.admin_token}"}
    with httpx.Client(base_url=admin_service.url, headers=headers, timeout=10) as client:
        answer = client.post(f"/api/requests/{top}/cancel")
    assert answer.status_code == 200, answer.text

    # Then its level leaves the panel at the next refresh
    expect(levels).to_have_count(3, timeout=EXPECT_MS)
    expect(levels.first.get_by_test_id("priority-level")).to_have_text("5")


def registered(redis_admin_url: str, service: AdminService, endpoint: str) -> bool:
    """The endpoint has an entry in the registry the dashboard lists."""
    client = url_client(redis_admin_url)
    try:
        score = client.zscore(KeySchema(service.prefix).endpoints, encode_endpoint(endpoint))
    finally:
        client.close()
    return score is not None


def listed(service: AdminService) -> list[str]:
    """The endpoints `GET /api/endpoints` lists (read token)."""
    headers = {"Authorization": f"Bearer {service.read_token}"}
    with httpx.Client(base_url=service.url, headers=headers, timeout=10) as client:
        answer = client.get("/api/endpoints")
    assert answer.status_code == 200, answer.text
    return [info["endpoint"] for info in answer.json()]


def test_admin_forgets_an_idle_endpoint_from_its_view(
    page: Page, admin_service: AdminService, redis_admin_url: str
) -> None:
    # Given an idle endpoint made by a typo, listed as a node's report lists it (nothing queued,
    # no receiver, and no node that will list it again)
    typo = "poll://dash/biling-7"
    client = url_client(redis_admin_url)
    try:
        key = KeySchema(admin_service.prefix).endpoints
        client.zadd(key, {encode_endpoint(typo): int(time.time() * 1000)})
    finally:
        client.close()

    # When a read-only user opens it, Then there is no Forget button
    open_dashboard(page, admin_service, admin_service.read_token)
    expect(page.get_by_test_id("role")).to_have_text("read-only", timeout=EXPECT_MS)
    endpoint_row(page, typo).get_by_test_id("endpoint-link").click()
    expect(page.get_by_test_id("queued-endpoint")).to_have_text(typo, timeout=EXPECT_MS)
    expect(page.get_by_role("button", name="Forget endpoint")).to_have_count(0)

    # When an admin signs in and opens it
    page.get_by_role("button", name="Sign out").click()
    page.get_by_label("Access token").fill(admin_service.admin_token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_test_id("role")).to_have_text("admin", timeout=EXPECT_MS)
    row = endpoint_row(page, typo)
    row.get_by_test_id("endpoint-link").click()

    # And asks to forget it, Then the confirmation says what forgetting does
    page.get_by_role("button", name="Forget endpoint").click()
    question = page.get_by_test_id("forget-question")
    expect(question).to_have_text(
        f"Forget {typo}? It leaves the endpoint list and these views; no request, limit or dead "
        "letter is removed. A live receiver or a new enqueue lists it again."
    )
    # ... and keeping it changes nothing
    page.get_by_role("button", name="Keep it").click()
    expect(page.get_by_test_id("forget-confirm")).to_be_hidden()
    expect(page.get_by_role("button", name="Forget endpoint")).to_be_visible()
    assert registered(redis_admin_url, admin_service, typo)

    # When the admin confirms
    page.get_by_role("button", name="Forget endpoint").click()
    page.get_by_role("button", name="Yes, forget it").click()

    # Then the page is back on the endpoint list, which no longer has it
    expect(page.get_by_test_id("status")).to_have_text(
        f"Forgot endpoint {typo}.", timeout=EXPECT_MS
    )
    expect(page.get_by_test_id("queued")).to_be_hidden()
    expect(row).to_have_count(0, timeout=EXPECT_MS)
    # ... and neither has the service nor the registry
    assert typo not in listed(admin_service)
    assert not registered(redis_admin_url, admin_service, typo)


def test_a_busy_endpoint_is_kept_unless_the_admin_forces_it(
    page: Page, admin_service: AdminService, redis_url: str, redis_admin_url: str
) -> None:
    # Given an endpoint with one request queued by a sender that is gone (no receiver, and no
    # node that will list it again)
    endpoint = "poll://dash/forget-busy"
    with Queue(RedisSettings.from_url(redis_url), prefix=admin_service.prefix) as sender:
        request_id = sender.notify(endpoint, "work", {"n": 1})
    assert registered(redis_admin_url, admin_service, endpoint)

    # When an admin opens it and confirms forgetting it
    open_dashboard(page, admin_service, admin_service.admin_token)
    row = endpoint_row(page, endpoint)
    expect(row.get_by_test_id("endpoint-depth")).to_have_text("1", timeout=EXPECT_MS)
    row.get_by_test_id("endpoint-link").click()
    page.get_by_role("button", name="Forget endpoint").click()
    page.get_by_role("button", name="Yes, forget it").click()

    # Then the service's refusal shows, with Forget anyway, and the endpoint is kept
    refused = page.get_by_test_id("forget-refused")
    expect(refused).to_contain_text(
        "Not forgotten (409): the endpoint has 1 queued, 0 in flight and 0 live receivers",
        timeout=EXPECT_MS,
    )
    expect(page.get_by_role("button", name="Yes, forget it")).to_have_count(0)
    expect(page.get_by_test_id("queued-endpoint")).to_have_text(endpoint)
    assert endpoint in listed(admin_service)

    # When the admin asks to forget it anyway, Then a second confirmation says what that means
    page.get_by_role("button", name="Forget anyway").click()
    expect(page.get_by_test_id("forget-question")).to_contain_text(
        f"Forget {endpoint} anyway? Its requests stay queued until taken or expired"
    )
    expect(refused).to_be_visible()
    # ... and keeping it there still changes nothing
    page.get_by_role("button", name="Keep it").click()
    expect(page.get_by_test_id("forget-confirm")).to_be_hidden()
    expect(row).to_have_count(1)
    assert endpoint in listed(admin_service)

    # When the admin goes through both confirmations
    page.get_by_role("button", name="Forget endpoint").click()
    page.get_by_role("button", name="Yes, forget it").click()
    page.get_by_role("button", name="Forget anyway").click()
    page.get_by_role("button", name="Yes, forget anyway").click()

    # Then it leaves the list, and its request stays queued
    expect(page.get_by_test_id("status")).to_have_text(
        f"Forgot endpoint {endpoint}; its 1 queued and 0 in-flight request(s) were left as "
        "they are.",
        timeout=EXPECT_MS,
    )
    expect(page.get_by_test_id("queued")).to_be_hidden()
    expect(row).to_have_count(0, timeout=EXPECT_MS)
    assert endpoint not in listed(admin_service)
    headers = {"Authorization": f"Bearer {admin_service.read_token}"}
    with httpx.Client(base_url=admin_service.url, headers=headers, timeout=10) as client:
        page_of = client.get("/api/queued", params={"endpoint": endpoint})
    assert page_of.status_code == 200, page_of.text
    assert [item["id"] for item in page_of.json()["items"]] == [request_id]
