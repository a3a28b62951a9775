"""A receiver in ANOTHER OS process: dequeue one request, answer it, exit.

Run as `python receiver_child.py <url> <prefix> <endpoint> <async|sync> <timeout_s>`.
It answers `{"pid": <its pid>, "params": <the request's params>}` and prints the request id.
Exit status: 0 answered, 3 nothing to dequeue within the timeout.
"""

from __future__ import annotations

import asyncio
import os
import sys

from prq import AsyncQueue, Queue, QueueSettings, Response

#: Exit status when no request arrived within the timeout.
EXIT_NOTHING_DEQUEUED = 3


def _answer(request_id: str, params: object) -> Response:
    return Response(id=request_id, result={"pid": os.getpid(), "params": params})


def run_sync(url: str, prefix: str, endpoint: str, timeout_s: float) -> int:
    with Queue.from_url(url, prefix=prefix, settings=QueueSettings(poll_interval_s=0.5)) as queue:
        pending = queue.dequeue(endpoint, timeout_s=timeout_s)
        if pending is None:
            return EXIT_NOTHING_DEQUEUED
        queue.apply_response(_answer(pending.id, pending.request.params))
        print(pending.id, flush=True)
        return 0


async def run_async(url: str, prefix: str, endpoint: str, timeout_s: float) -> int:
    settings = QueueSettings(poll_interval_s=0.5)
    async with AsyncQueue.from_url(url, prefix=prefix, settings=settings) as queue:
        pending = await queue.dequeue(endpoint, timeout_s=timeout_s)
        if pending is None:
            return EXIT_NOTHING_DEQUEUED
        await queue.apply_response(_answer(pending.id, pending.request.params))
        print(pending.id, flush=True)
        return 0


def main(argv: list[str]) -> int:
    url, prefix, endpoint, facade, timeout_s = argv
    if facade == "sync":
        return run_sync(url, prefix, endpoint, float(timeout_s))
    return asyncio.run(run_async(url, prefix, endpoint, float(timeout_s)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
