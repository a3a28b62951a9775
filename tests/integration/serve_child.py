"""A receiver in another OS process, written as the README's quickstart receiver is: a plain
`serve` with no stop of its own, run until the process is stopped.

Run as `python serve_child.py <url> <prefix> <endpoint> <async|sync> <concurrency>`.
It prints its node id once started, and answers `{"pid": <its pid>}`; a request whose params
say `{"sleep_s": x}` keeps the handler busy for x seconds first.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

from prq import AsyncQueue, Queue, QueueSettings, Request

#: Long enough that a dead receiver's parks outlive the test's calls (as in production, where
#: they last a poll interval): only the hand-off confirmation can save a call sent to one.
SETTINGS = QueueSettings(poll_interval_s=30, dequeue_timeout_s=60, shutdown_timeout_s=10)


def handle(request: Request) -> dict[str, Any]:
    params = request.params if isinstance(request.params, dict) else {}
    sleep_s = params.get("sleep_s", 0)
    if isinstance(sleep_s, int | float):
        time.sleep(sleep_s)  # the handler's work, not a synchronisation
    return {"pid": os.getpid()}


def run_sync(url: str, prefix: str, endpoint: str, concurrency: int) -> None:
    with Queue.from_url(url, prefix=prefix, settings=SETTINGS) as queue:
        print(queue.node_id, flush=True)
        queue.serve(endpoint, handle, concurrency=concurrency)


async def run_async(url: str, prefix: str, endpoint: str, concurrency: int) -> None:
    async with AsyncQueue.from_url(url, prefix=prefix, settings=SETTINGS) as queue:
        print(queue.node_id, flush=True)
        await queue.serve(endpoint, handle, concurrency=concurrency)


def main(argv: list[str]) -> int:
    url, prefix, endpoint, facade, concurrency = argv
    if facade == "sync":
        run_sync(url, prefix, endpoint, int(concurrency))
    else:
        asyncio.run(run_async(url, prefix, endpoint, int(concurrency)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
