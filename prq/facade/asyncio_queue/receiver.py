"""AsyncReceiver: the receiver's API of AsyncQueue (dequeue, apply_response).

Taking requests (a cancelled take gives back what it was handed, in the background) and
answering them: an answer's body is encoded here, and the answers go out as one step of the
node's link (`_write_answers`). These are what prq.serve.worker's loop uses; `serve` itself is
AsyncQueue's (it hands the whole queue to that loop).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from prq.core.errors import PrqError, QueueShutdown
from prq.core.lifecycle import PendingRequest
from prq.core.models import Response
from prq.core.names import validate_endpoint
from prq.facade.asyncio_queue.driver import AsyncDriver
from prq.protocol.effects import Reply

logger = logging.getLogger(__name__)

__all__ = ["AsyncReceiver"]


class AsyncReceiver(AsyncDriver):
    """AsyncQueue's receiver's API (a mixin over AsyncDriver's state and flow driver)."""

    async def dequeue(
        self, endpoint: str, *, timeout_s: float | None = None
    ) -> PendingRequest | None:
        """Take the next request of `endpoint`, waiting up to the long-poll; None if idle."""
        taken = await self.dequeue_many(endpoint, 1, timeout_s=timeout_s)
        return taken[0] if taken else None

    async def dequeue_many(
        self,
        endpoint: str,
        max_items: int,
        *,
        timeout_s: float | None = None,
    ) -> list[PendingRequest]:
        """Take up to `max_items` requests of `endpoint` in one step (waits for the first)."""
        timeout = self.settings.dequeue_timeout_s if timeout_s is None else timeout_s
        return await self._take(endpoint, max_items, timeout)

    async def _take(
        self,
        endpoint: str,
        max_items: int,
        timeout_s: float,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[PendingRequest]:
        validate_endpoint(endpoint)
        await self._ready()
        await self._listen(endpoint)
        channel = self.keys.endpoint(endpoint).pulse_channel
        await self._pulses.ensure_subscribed(channel)
        current: list[str] = []
        try:
            return await self._run(
                self._receive_flow(endpoint, channel, max_items, timeout_s, should_stop, current)
            )
        except BaseException:
            # cut short (a cancel; an error after the take returned: a failed take leaves
            # `current` empty, its token a spare): give back what the take got
            if current:
                self._give_back_in_background(current)
            raise

    def _give_back_in_background(self, tokens: list[str]) -> None:
        """A take was cut short (e.g. `asyncio.wait_for` around `dequeue`): withdraw its park
        and give back what it was handed or took, so no request waits on a take that is gone."""
        if self._closed:
            return

        async def give_back() -> None:
            try:
                await self._run(self._unpark_flow(tokens), closing_ok=True)
            except Exception as exc:
                logger.debug("giving back a cancelled take failed error=%s", exc)

        task = asyncio.ensure_future(give_back())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def apply_response(self, response: Response) -> None:
        """Answer a request this node dequeued; the first response wins (also while the queue
        closes, until the shutdown timeout).

        An answer that cannot be sent (over max_body_bytes, not JSON, DataStreams that cannot
        be stored) still ends the call: the caller is answered with an error saying why
        (type "ResponseTooLarge", "SerializationError", ...) and the reason is raised here
        (PayloadTooLarge, ...). An answer Redis does not take within the retry budget raises
        QueueUnavailable, and the request is let go: nothing beats for it any more, so its
        caller's receiver check decides."""
        body, error = await self._answer_body(response)
        if body is not None:
            failed = await self._write_answers([(response.id, body)])
            if failed:
                raise failed[response.id]
        if error is not None:
            raise error

    async def _answer_body(self, response: Response) -> tuple[bytes | None, PrqError | None]:
        """apply_response's first half: the body that answers a held request (None when this
        node does not hold it), and the error to report when the service's answer could not
        be sent and the body says so instead. The body goes out through `_write_answers`."""
        await self._ready(closing_ok=True)
        if not self._holds(response.id):
            return None, None
        try:
            return await self._encoded_answer(response), None
        except Exception as exc:
            error, body = self._answer_instead(response.id, exc)
            return body, error

    async def _encoded_answer(self, response: Response) -> bytes:
        """The body that answers a held request: its streams stored, its size checked, kept
        beside Redis over inline_limit_bytes."""
        ttl_s = self._answer_ttl_s(response.id)
        if self._streams.unstored(response):
            response = await asyncio.to_thread(self._streams.store_response, response, ttl_s)
        body = self._encode_response(response)
        if self._streams.spills(body):
            body = await asyncio.to_thread(self._streams.spill_response, response, body, ttl_s)
        return body

    async def _write_answers(self, answers: Sequence[tuple[str, bytes]]) -> dict[str, PrqError]:
        """apply_response's second half, for one held request or many, as Queue._write_answers
        does it; here the answers are one step of the node's link (they share a round trip and
        its fate), so that many cost the event loop about what one does."""
        answering = self._start_answers(answers)
        failed: dict[str, PrqError] = {}
        while answering:  # (an answer goes again only under a new owner token: _answer_flow)
            # one step for all of them: they share the round trip, and its fate
            results: list[list[Reply] | PrqError]
            if self._closed:
                results = [self._shutdown_error(False)] * len(answering)
            else:
                try:
                    replies = await self._io.execute(
                        [call for answer in answering for call in answer.effect.calls]
                    )
                except QueueShutdown:  # closed while the calls were on their way
                    results = [self._shutdown_error(True)] * len(answering)
                except PrqError as exc:
                    results = [exc] * len(answering)
                else:
                    results, at = [], 0
                    for answer in answering:
                        results.append(replies[at : at + len(answer.effect.calls)])
                        at += len(answer.effect.calls)
            answering, clean_ups = self._settle_answers(answering, results, failed)
            for clean_up in clean_ups:
                await asyncio.to_thread(clean_up)
        return failed
