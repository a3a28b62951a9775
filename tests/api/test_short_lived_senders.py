"""Queued work nobody serves is visible even when whoever queued it is gone: a process that
notifies, sends, or starts a call and dies at once (before any presence report of its node)
leaves its endpoints listed by the admin service, `/metrics` and `prq stats`, with the work
queued on them."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.test_metrics import gauge, scrape
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: One endpoint per way of queueing work; each is new to the sending node.
NOTIFIED, SENT, CALLED = "poll://gone-notify", "poll://gone-send", "poll://gone-call"

#: The sender: one node queues one request per endpoint, then the process dies at once (no
#: close: nothing that runs at shutdown may be what makes the endpoints visible).
SENDER = """
import os, sys, threading, time
from prq import Queue, Request, RequestState
url, prefix, notified, sent, called = sys.argv[1:6]
queue = Queue.from_url(url, prefix=prefix)
queue.notify(notified, "ping")
queue.send(Request(endpoint=sent, method="m"), on_response=print, on_failure=print)
waiting = Request(endpoint=called, method="m")
threading.Thread(target=queue.queue_and_wait, args=(waiting,), daemon=True).start()
deadline = time.monotonic() + 20
while queue.status(waiting.id).state is not RequestState.QUEUED:
    if time.monotonic() > deadline:
        sys.exit("the call was not queued in time")
    time.sleep(0.01)
os._exit(0)
"""


async def test_endpoints_queued_to_by_a_process_that_died_at_once_are_listed_everywhere(
    http: httpx.AsyncClient, read: dict[str, str], redis_url: str, key_prefix: str
) -> None:
    # Given a process that queued one request on each of three new endpoints (a notify, a
    # send, a call it was waiting on) and died right after, nobody serving them
    died = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", SENDER, redis_url, key_prefix, NOTIFIED, SENT, CALLED],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert died.returncode == 0, died.stderr
    endpoints = {NOTIFIED, SENT, CALLED}

    # When the admin service lists the endpoints
    async def all_listed() -> dict[str, Any] | None:
        infos = (await http.get("/api/endpoints", headers=read)).json()
        found = {i["endpoint"]: i for i in infos if i["endpoint"] in endpoints}
        return found if set(found) == endpoints else None

    listing = await async_wait_until(all_listed, 10, 0.05, "the three endpoints listed")

    # Then each shows its queued request, with no receiver
    for endpoint in endpoints:
        assert (listing[endpoint]["depth"], listing[endpoint]["receivers"]) == (1, 0), endpoint

    # And /metrics has each one's depth
    families = await scrape(http, read)
    for endpoint in endpoints:
        assert gauge(families, "prq_endpoint_depth", endpoint) == 1, endpoint

    # And `prq stats` lists them too
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRQ_")}
    env |= {"PRQ_REDIS_URL": redis_url, "PRQ_PREFIX": key_prefix}
    shown = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "prq.cli", "stats", "--json"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    report = {e["endpoint"]: e for e in json.loads(shown.stdout)["endpoints"]}
    for endpoint in endpoints:
        assert report[endpoint]["depth"] == 1, endpoint
