"""A receiver's answers to the requests it holds.

An answer goes under the request's owner token (flows.respond_flow), again under a new one if a
redelivery of the request reached this node meanwhile; its outcome is booked (the request let
go, its DataStreams and large body cleaned up once the answer was accepted). An answer that
cannot be sent is replaced by an error answer; one Redis did not take lets the request go. The
facades send the answers of several requests in one round trip (`_start_answers`,
`_settle_answers`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prq.core.bodies import is_spilled
from prq.core.defaults import MAX_ATTEMPTS_LIMIT
from prq.core.errors import PayloadTooLarge, PrqError, SerializationError, ServerError
from prq.core.lifecycle import PendingRequest
from prq.core.models import Response
from prq.node.receiver.held import HeldRequests
from prq.observe import metrics
from prq.protocol.effects import Exec, Flow, Reply
from prq.protocol.flows.receiver import respond_flow

logger = logging.getLogger(__name__)

__all__ = ["Answerer", "Answering"]


# (not frozen: a frozen dataclass costs 3.5 times as much to build, one per answer)
@dataclass(slots=True)
class Answering:
    """An answer on its way: the request it answers, its body, its flow and the step the flow
    asks for next (`_start_answers`, `_settle_answers`)."""

    request_id: str
    body: bytes
    flow: Flow[str]
    effect: Exec


class Answerer(HeldRequests):
    """Answering held requests (a mixin of `QueueBase`)."""

    def _encode_response(self, response: Response) -> bytes:
        body = response.model_dump_json().encode()
        self._check_size(body, "response", response.id)
        return body

    def _holds(self, request_id: str) -> bool:
        """Whether this node holds the request, i.e. took it and has not answered it (an
        answer to anything else is dropped, with a warning)."""
        if request_id in self._held:
            return True
        logger.warning("response for a request this node does not hold request_id=%s", request_id)
        return False

    def _answer_ttl_s(self, request_id: str) -> float:
        """How long the data an answer to a held request keeps beside Redis must last: as long
        as the answer may be kept, which is what the request asked for within this node's
        bounds (QueueSettings.response_ttl_for), or longer when a caller waits for it
        (waited_response_ttl_s)."""
        pending = self._held.get(request_id)
        asked = pending.request.response_ttl_s if pending is not None else None
        return max(self.settings.response_ttl_for(asked), self.settings.waited_response_ttl_s())

    def _answer_instead(self, request_id: str, exc: Exception) -> tuple[PrqError, bytes]:
        """An answer that cannot be sent (over max_body_bytes, not JSON, DataStreams that
        cannot be stored): the error to raise to whoever answered, and the body that answers
        the caller in its place. The call must end: a request held and beaten for, yet never
        answered, would keep its caller waiting for as long as this node lives."""
        error: PrqError
        if isinstance(exc, PayloadTooLarge):
            kind, error = "ResponseTooLarge", exc
        elif isinstance(exc, PrqError):
            kind, error = type(exc).__name__, exc
        else:
            kind = "SerializationError"
            error = SerializationError(f"the response to {request_id} cannot be encoded: {exc}")
            error.__cause__ = exc
        error.add_note(f"request {request_id} was answered with a {kind} error instead")
        reason = ServerError(type=kind, message=f"the service's answer cannot be sent: {exc}"[:500])
        return error, Response(id=request_id, error=reason).model_dump_json().encode()

    def _unanswered(self, request_id: str, exc: PrqError) -> None:
        """An answer Redis did not take (away past the retry budget, full): let the request
        go, so that no heartbeat says it is still being worked on, and its caller's receiver
        check decides (ReceiverLost; an at_least_once request is handed out again, and a
        redelivery to this node gets the answer it keeps). Writing an error answer instead
        would only fail the same way, after another retry budget."""
        self._held.pop(request_id, None)
        self._held_bodies.pop(request_id, None)
        self._watch.liveness.release(request_id)
        logger.error("answer not written, request let go request_id=%s error=%s", request_id, exc)

    def _start_answers(self, answers: Sequence[tuple[str, bytes]]) -> list[Answering]:
        """The first step of answering held requests, one answer each (`_write_answers` of
        either facade sends them in one round trip); answers to requests no longer held are
        left out."""
        started: list[Answering] = []
        for request_id, body in answers:
            flow = self._respond_flow(request_id, body)
            if flow is None:
                continue
            effect = flow.send(None)
            assert isinstance(effect, Exec)  # (respond_flow only sends)
            started.append(Answering(request_id, body, flow, effect))
        return started

    def _settle_answers(
        self,
        answering: list[Answering],
        results: Sequence[list[Reply] | PrqError],
        failed: dict[str, PrqError],
    ) -> tuple[list[Answering], list[Callable[[], None]]]:
        """Book one round trip's results of answers: the answers that go again (under a new
        owner token: _answer_flow), and the clean-ups to run (_after_respond). An answer that
        could not be written lets its request go (_unanswered) and joins `failed`."""
        again: list[Answering] = []
        clean_ups: list[Callable[[], None]] = []
        for answer, result in zip(answering, results, strict=True):
            flow = answer.flow
            try:
                effect = flow.throw(result) if isinstance(result, PrqError) else flow.send(result)
            except StopIteration as done:
                outcome: str = done.value
            except PrqError as exc:
                self._unanswered(answer.request_id, exc)
                failed[answer.request_id] = exc
                continue
            else:
                assert isinstance(effect, Exec)
                again.append(Answering(answer.request_id, answer.body, flow, effect))
                continue
            clean_up = self._after_respond(answer.request_id, outcome, answer.body)
            if clean_up is not None:
                clean_ups.append(clean_up)
        return again, clean_ups

    def _respond_flow(self, request_id: str, body: bytes) -> Flow[str] | None:
        """The flow that answers a held request with `body`, or None if this node no longer
        holds it."""
        pending = self._held.get(request_id)
        if pending is None:
            return None
        if pending.request.delivery == "at_least_once":
            self._ran.remember(request_id, body)
        return self._answer_flow(pending, body)

    def _answer_flow(self, pending: PendingRequest, body: bytes) -> Flow[str]:
        """Answer a held request under its owner token; its outcome. An answer refused while
        a redelivery of the request reached this node (_ran_again: the run now answers under
        the redelivery's owner token) goes again under the new token: the refusal meant the
        hand-out it was sent for, not this run. Each new token is another hand-out, so the
        answer goes at most once per attempt."""
        ttl_s = self.settings.response_ttl_for(pending.request.response_ttl_s)
        outcome = "stale"
        for _ in range(MAX_ATTEMPTS_LIMIT):
            token = pending.owner_token
            outcome = yield from respond_flow(
                self.ctx, pending.request.endpoint, pending.id, token, body, ttl_s
            )
            if outcome in ("ok", "replay") or pending.owner_token == token:
                return outcome
            logger.info(
                "answer sent again under an adopted redelivery's owner token request_id=%s",
                pending.id,
            )
        return outcome

    def _after_respond(
        self, request_id: str, outcome: str, body: bytes
    ) -> Callable[[], None] | None:
        """Book an answer's outcome; returns the clean-up to run off the event loop, if any:
        once the answer was accepted ("ok", or "replay" of one accepted before), the
        request's DataStreams and large body go; a dropped answer's large body goes, and
        nothing of the request's."""
        pending = self._held.pop(request_id, None)
        request_body = self._held_bodies.pop(request_id, None)
        self._watch.liveness.release(request_id)
        if outcome == "ok" and pending is not None:
            metrics.series(pending.request.endpoint).responded.inc()
        accepted = outcome in ("ok", "replay")
        if not accepted:
            # Refused ("fenced", "stale": e.g. handed out again meanwhile, "duplicate"): the
            # request's body and streams belong to whoever holds or answered it now.
            logger.warning("response dropped request_id=%s outcome=%s", request_id, outcome)
            request_body = None
        streams = pending.request.streams if accepted and pending is not None else {}
        if not streams and request_body is None and (accepted or not is_spilled(body)):
            return None

        def clean_up() -> None:
            self._streams.delete(streams)
            if request_body is not None:
                self._streams.delete_body(request_body)
            if not accepted:
                self._streams.delete_body(body)

        return clean_up
