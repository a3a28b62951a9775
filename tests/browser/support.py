"""Pieces of the browser test bed: the service's address and tokens, and callers that wait."""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from prq import Queue, QueueSettings, RedisSettings, Request, RequestState
from prq.protocol.dead import dead_letter_call
from tests.redis_servers import url_client, wait_until

__all__ = ["AdminService", "Callers"]

#: How long a caller waits for pickup: far longer than the test, so requests stay queued.
PICKUP_TIMEOUT_S = 120.0
#: How often the callers' node reports its endpoints to the registry the dashboard lists (the
#: default, once a minute, would keep a new endpoint off the page for up to a minute).
REPORT_INTERVAL_S = 0.5
#: Bound on a request showing up as queued, and on a caller returning after a cancel.
STOP_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class AdminService:
    """Where the admin service listens, its key prefix, and its two tokens."""

    url: str
    prefix: str
    admin_token: str
    read_token: str


class Callers:
    """Blocking callers, one thread each, waiting for receivers that never come."""

    def __init__(self, redis_url: str, prefix: str) -> None:
        settings = QueueSettings(
            pickup_timeout_s=PICKUP_TIMEOUT_S, data_loss_check_interval_s=REPORT_INTERVAL_S
        )
        self.queue = Queue(RedisSettings.from_url(redis_url), prefix=prefix, settings=settings)
        self._executor = ThreadPoolExecutor(16, thread_name_prefix="caller")
        self._calls: dict[str, Future[Any]] = {}

    def call(self, endpoint: str, method: str, *, producer: str, priority: int = 0) -> str:
        """Send one request from a worker thread; return its id once it is queued."""
        self.queue.start()
        request_id = f"dash-{len(self._calls)}-{os.urandom(4).hex()}"
        self._calls[request_id] = self._executor.submit(
            self.queue.call,
            endpoint,
            method,
            {"n": len(self._calls)},
            producer=producer,
            priority=priority,
            request_id=request_id,
        )
        wait_until(
            lambda: self.queue.status(request_id).state != RequestState.UNKNOWN,
            STOP_TIMEOUT_S,
            0.02,
            f"request {request_id} queued",
        )
        return request_id

    def dead_letter(self, redis_url: str, endpoint: str, body: bytes | None = None) -> str:
        """Dead-letter a fresh request of `endpoint` as prq does, with its own bytes or `body`
        (what a receiver found stored); return its id."""
        self.queue.start()  # loads the scripts
        request = Request(endpoint=endpoint, method="work", params={"dead": True})
        stored = request.model_dump_json().encode() if body is None else body
        call = dead_letter_call(
            self.queue.ctx, endpoint, request.id, stored, "attempts_exhausted", 3
        )
        client = url_client(redis_url)
        try:
            client.execute_command(*call.args)  # type: ignore[no-untyped-call]
        finally:
            client.close()
        return request.id

    def outcome(self, request_id: str) -> BaseException | None:
        """What the caller of `request_id` raised (None if it returned), waiting up to a bound."""
        return self._calls[request_id].exception(timeout=STOP_TIMEOUT_S)

    def close(self) -> None:
        """Cancel what still waits, wait (bounded) for every caller, close the queue."""
        try:
            for request_id, future in self._calls.items():
                if not future.done():
                    self.queue.cancel(request_id)
            for future in self._calls.values():
                future.exception(timeout=STOP_TIMEOUT_S)
        finally:
            self.queue.close()  # wakes any caller still waiting (QueueShutdown)
            self._executor.shutdown(wait=True, cancel_futures=True)
