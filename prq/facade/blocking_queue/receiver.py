"""BlockingReceiver: the receiver's API of Queue (dequeue, apply_response).

Taking requests (a take cut short gives back what it was handed) and answering them: an
answer's body is encoded here, and the answers go out in one round trip (`_write_answers`).
These are what prq.serve.worker's loop uses; `serve` itself is Queue's (it hands the whole
queue to that loop).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

from prq.core.errors import PrqError
from prq.core.lifecycle import PendingRequest
from prq.core.models import Response
from prq.core.names import validate_endpoint
from prq.facade.blocking_queue.driver import BlockingDriver
from prq.protocol.effects import Reply

__all__ = ["BlockingReceiver"]


class BlockingReceiver(BlockingDriver):
    """Queue's receiver's API (a mixin over BlockingDriver's state and flow driver)."""

    def dequeue(self, endpoint: str, *, timeout_s: float | None = None) -> PendingRequest | None:
        """Take the next request of `endpoint`, waiting up to the long-poll; None if idle."""
        taken = self.dequeue_many(endpoint, 1, timeout_s=timeout_s)
        return taken[0] if taken else None

    def dequeue_many(
        self,
        endpoint: str,
        max_items: int,
        *,
        timeout_s: float | None = None,
    ) -> list[PendingRequest]:
        """Take up to `max_items` requests of `endpoint` in one step (waits for the first)."""
        timeout = self.settings.dequeue_timeout_s if timeout_s is None else timeout_s
        return self._take(endpoint, max_items, timeout)

    def _take(
        self,
        endpoint: str,
        max_items: int,
        timeout_s: float,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[PendingRequest]:
        validate_endpoint(endpoint)
        self._ready()
        self._listen(endpoint)
        channel = self.keys.endpoint(endpoint).pulse_channel
        self._pulses.ensure_subscribed(channel)
        current: list[str] = []
        try:
            return self._run(
                self._receive_flow(endpoint, channel, max_items, timeout_s, should_stop, current)
            )
        except BaseException:
            if current:
                # cut short after the take returned (an error in the steps after it,
                # KeyboardInterrupt, SystemExit; a failed take leaves `current` empty, its
                # token a spare): give back what the take was handed or took
                with contextlib.suppress(Exception):
                    self._run(self._unpark_flow(current), closing_ok=True)
            raise

    def apply_response(self, response: Response) -> None:
        """Answer a request this node dequeued; the first response wins (also while the queue
        closes, until the shutdown timeout).

        An answer that cannot be sent (over max_body_bytes, not JSON, DataStreams that cannot
        be stored) still ends the call: the caller is answered with an error saying why
        (type "ResponseTooLarge", "SerializationError", ...) and the reason is raised here
        (PayloadTooLarge, ...). An answer Redis does not take within the retry budget raises
        QueueUnavailable, and the request is let go: nothing beats for it any more, so its
        caller's receiver check decides."""
        body, error = self._answer_body(response)
        if body is not None:
            failed = self._write_answers([(response.id, body)])
            if failed:
                raise failed[response.id]
        if error is not None:
            raise error

    def _answer_body(self, response: Response) -> tuple[bytes | None, PrqError | None]:
        """apply_response's first half: the body that answers a held request
        (None when this node does not hold it), and the error to report when the service's
        answer could not be sent and the body says so instead. The body goes out through
        `_write_answers`."""
        self._ready(closing_ok=True)
        if not self._holds(response.id):
            return None, None
        try:
            return self._encoded_answer(response), None
        except Exception as exc:
            error, body = self._answer_instead(response.id, exc)
            return body, error

    def _write_answers(self, answers: Sequence[tuple[str, bytes]]) -> dict[str, PrqError]:
        """apply_response's second half, for one held request or many: their answers in one
        round trip (answers to one endpoint go as one script call, merge_answers), each
        booked (_after_respond); one more round trip for answers that go again under a new
        owner token (_answer_flow). An answer that cannot be written lets its request go
        (_unanswered); returns those answers' errors, by request id."""
        answering = self._start_answers(answers)
        failed: dict[str, PrqError] = {}
        while answering:  # (an answer goes again only under a new owner token: _answer_flow)
            if self._closed:
                results: list[list[Reply] | PrqError] = [self._shutdown_error(False)] * len(
                    answering
                )
            else:
                results = self._io.execute_many([answer.effect.calls for answer in answering])
            answering, clean_ups = self._settle_answers(answering, results, failed)
            for clean_up in clean_ups:
                clean_up()
        return failed

    def _encoded_answer(self, response: Response) -> bytes:
        """The body that answers a held request: its streams stored, its size checked, kept
        beside Redis over inline_limit_bytes."""
        ttl_s = self._answer_ttl_s(response.id)
        response = self._streams.store_response(response, ttl_s)
        body = self._encode_response(response)
        if self._streams.spills(body):
            body = self._streams.spill_response(response, body, ttl_s)
        return body
