"""How a blocking serve loop's worker thread handles one request (_answer: run the handler,
build the answer) and how the threads' answers go out together (_AnswerTurns).
"""

from __future__ import annotations

import logging
import threading
import time

from prq.core.errors import PrqError
from prq.core.lifecycle import PendingRequest
from prq.observe import tracing
from prq.protocol.effects import Handler
from prq.serve.current import _run_sync_handler
from prq.serve.handled import handler_response
from prq.serve.pace import _Pace
from prq.serve.served import BlockingServedQueue

logger = logging.getLogger("prq.serve.worker")  # (the serve loops log under one name)


class _AnswerTurns:
    """The answers of one `serve_sync`'s workers. A worker whose answer finds no answer being
    written writes it at once, with every answer the others leave meanwhile; one whose answer
    finds a write in flight leaves it to that writer and goes on to its next request. So a lone
    answer goes out at once, and under load one round trip carries many answers without a
    thread waiting on each (a request stays held, beaten for and counted as serving, until its
    answer is written)."""

    def __init__(self, queue: BlockingServedQueue) -> None:
        self.queue = queue
        self.lock = threading.Lock()
        self.queued: list[tuple[str, bytes]] = []
        self.writing = False

    def answer(self, request_id: str, body: bytes) -> None:
        with self.lock:
            self.queued.append((request_id, body))
            if self.writing:
                return
            self.writing = True
        batch: list[tuple[str, bytes]] = []
        try:
            while True:
                with self.lock:
                    batch, self.queued = self.queued, []
                    if not batch:
                        self.writing = False
                        return
                for written, error in self.queue._write_answers(batch).items():
                    logger.error("could not answer request_id=%s error=%s", written, error)
                for written, _ in batch:
                    self.queue._serving.discard(written)
        except BaseException:
            with self.lock:  # the next worker that answers writes what is left
                self.writing = False
            for written, _ in batch:
                self.queue._serving.discard(written)
            raise


def _answer(
    queue: BlockingServedQueue,
    handler: Handler,
    pending: PendingRequest,
    answers: _AnswerTurns,
    pace: _Pace,
) -> None:
    queue._serving.add(pending.id)
    body: bytes | None = None
    try:
        with tracing.processing(pending, queue.node_id) as traced:
            started = time.monotonic()
            result: object = None
            failure: Exception | None = None
            try:
                result = _run_sync_handler(handler, pending)
            except Exception as exc:
                traced.failed(exc)
                failure = exc
            response = handler_response(queue.node_id, pending, result, failure)
            pace.ran(time.monotonic() - started)
            try:
                body, error = queue._answer_body(response)
            except PrqError as exc:
                error = exc
            if error is not None:
                logger.error("could not answer request_id=%s error=%s", pending.id, error)
            if body is not None:
                answers.answer(pending.id, body)  # it leaves `_serving` once written
    finally:
        if body is None:
            queue._serving.discard(pending.id)
