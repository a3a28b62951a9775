"""A receiver process for the at_least_once crash matrix (test_scenario_13_crash_matrix.py).

It serves one endpoint with `DedupingService`: a handler that makes its side effect idempotent
on the delivery hash (the output is written once per hash, whatever the attempt), and kills its
own process with SIGKILL once, at one step boundary:

    after_take      the request was taken and handed to the handler; nothing done yet
    after_handler   the handler's side effect is done; no response written
    after_response  the response is written (and its pulse published: one atomic step in
                    apply_response.lua, so "before the pulse" is this same point)

"Once" is decided in Redis (SET NX), so a respawned or second crashing receiver does not crash
again. Usage: python -m tests.fault.crash_receiver '<json config>' (see `main`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from prq import Queue, QueueSettings, Request, current_request
from prq.node.receiver import answering

#: Where a receiver may be killed; see the module docstring.
CRASH_POINTS = ("after_take", "after_handler", "after_response")


class DedupingService:
    """The handler of the matrix: its output is keyed by the delivery hash, so however many
    times a request runs, it yields one output; runs are counted to show what ran twice."""

    def __init__(self, url: str, prefix: str, crash_at: str | None = None) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=10)
        self.prefix = prefix
        self.crash_at = crash_at

    def output_key(self, delivery_hash: str) -> str:
        return f"{self.prefix}:test:out:{delivery_hash}"

    def runs_key(self, delivery_hash: str) -> str:
        return f"{self.prefix}:test:runs:{delivery_hash}"

    def crash(self, point: str) -> None:
        """SIGKILL this process if `point` is the crash point and no receiver crashed yet."""
        if point == self.crash_at and self.client.set(
            f"{self.prefix}:test:crashed", point, nx=True
        ):
            os.kill(os.getpid(), signal.SIGKILL)

    def __call__(self, request: Request) -> Any:
        self.crash("after_take")
        pending = current_request()
        assert pending is not None
        delivery = pending.delivery.delivery_hash
        self.client.incr(self.runs_key(delivery))
        self.client.set(self.output_key(delivery), json.dumps(request.params), nx=True)
        self.crash("after_handler")
        return json.loads(self.client.get(self.output_key(delivery)) or b"null")


def main(argv: list[str]) -> int:
    """Config keys: url, prefix, endpoint, crash_at, settings (QueueSettings fields), ready
    (a file to create once serving), max_lifetime_s (the process exits after it, whatever)."""
    config = json.loads(argv[1])
    service = DedupingService(config["url"], config["prefix"], config["crash_at"])
    if config["crash_at"] == "after_response":
        after_respond = answering.Answerer._after_respond

        def answered_then_crash(
            self: answering.Answerer, request_id: str, outcome: str, body: bytes
        ) -> Callable[[], None] | None:
            clean_up = after_respond(self, request_id, outcome, body)
            service.crash("after_response")
            return clean_up

        answering.Answerer._after_respond = answered_then_crash  # type: ignore[method-assign]
    # a watchdog: a test that goes wrong must not leave this process behind
    lifetime = float(config["max_lifetime_s"])
    threading.Timer(lifetime, lambda: os._exit(3)).start()
    settings = QueueSettings(**config["settings"])
    stop = threading.Event()
    with Queue.from_url(config["url"], prefix=config["prefix"], settings=settings) as queue:
        Path(config["ready"]).touch()
        queue.serve(config["endpoint"], service, concurrency=1, stop=stop)  # until killed
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
