"""One node of the queue: identity, settings, keys, and the request handling both facades share.

Nothing here does I/O. `AsyncQueue` (queue.py) and `Queue` (sync.py) add the I/O path: they
drive the flows of flows.py and own the connections. The node keeps two local maps:
`_sent` (requests it waits for: id → endpoint) and `_held` (requests it took and has not
answered: id → PendingRequest with the owner token that answering needs).
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Self

from pydantic import JsonValue

from prq import metrics, tracing
from prq._types import Call, Exec, Flow, Offload, Reply
from prq.bodies import is_spilled
from prq.bodies import parse as parse_body
from prq.config import MAX_ATTEMPTS_LIMIT, QueueSettings, RedisSettings
from prq.data_loss import Floor
from prq.dead import dead_letter_call
from prq.dedup import delivery_hash
from prq.errors import (
    DataLoss,
    PayloadTooLarge,
    PrqError,
    QueueFull,
    QueueShutdown,
    QueueUnavailable,
    RemoteError,
    SerializationError,
    SignatureError,
)
from prq.flows import (
    Context,
    TakeResult,
    cancel_flow,
    layout_flow,
    locator_calls,
    new_token,
    registry_calls,
    respond_flow,
    take_flow,
)
from prq.health import INFO_CALLS
from prq.keys import KeySchema
from prq.models import (
    Delivery,
    DeliveryInfo,
    PendingRequest,
    Request,
    Response,
    ServerError,
    check_body_size,
    checked_model,
    decode_stored_request,
    encode_stored_request,
    validate_endpoint,
)
from prq.pulses import PulseRouter, PulsesBase
from prq.ran import RanRequests
from prq.redis_io import IOCounters
from prq.scripts import (
    Redelivery,
    TakenItem,
    enqueue_many_call,
    hand_back_call,
    parse_enqueue_many,
    parse_unpark,
    unpark_call,
)
from prq.signing import Renewals, Signer, unwrap
from prq.stream_keeper import StreamKeeper
from prq.taken import TakenRequests
from prq.topology import is_cluster_url
from prq.watch import NodeWatch

if TYPE_CHECKING:
    from prq.datastreams import DataStreamStore

logger = logging.getLogger(__name__)

__all__ = ["SHUTDOWN_POLL_S", "QueueBase", "QueueStats"]

#: How often closing looks whether the held requests were answered (seconds).
SHUTDOWN_POLL_S = 0.02


@dataclass(frozen=True, slots=True)
class Adopted:
    """Taken items sorted: to run, undecodable, delivered twice by a rolled-back Redis (to be
    cancelled), and at_least_once redeliveries of what this node ran already."""

    good: list[PendingRequest]
    bad: list[tuple[TakenItem, SerializationError]]
    refused: list[str]
    ran: list[TakenItem]


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Client-side counters of one node (for tests, benchmarks and metrics)."""

    redis_commands: int
    round_trips: int
    redis_retries: int
    subscriptions: int
    pubsub_reconnects: int
    pulses_received: int
    held_requests: int
    heartbeats_sent: int = 0
    data_loss_events: int = 0


# (not frozen: a frozen dataclass costs 3.5 times as much to build, one per answer)
@dataclass(slots=True)
class Answering:
    """An answer on its way: the request it answers, its body, its flow and the step the flow
    asks for next (`_start_answers`, `_settle_answers`)."""

    request_id: str
    body: bytes
    flow: Flow[str]
    effect: Exec


class QueueBase:
    """What both facades share: settings, keys, node identity, and pure request handling."""

    _io: IOCounters
    _pulses: PulsesBase
    _router: PulseRouter[Any]
    _watch: NodeWatch

    @classmethod
    def from_url(
        cls,
        url: str | None = None,
        *,
        prefix: str = "prq",
        settings: QueueSettings | None = None,
        datastreams: DataStreamStore | None = None,
        redis_settings: RedisSettings | None = None,
    ) -> Self:
        """A queue on the Redis at `url` (None reads PRQ_REDIS_URL, or takes
        `redis_settings.url`), with the timings of `settings` and the connection settings of
        `redis_settings` (timeouts, pool size, TLS files); a `url` given beside
        `redis_settings` replaces its URL."""
        if redis_settings is None:
            redis_settings = RedisSettings.from_url(url)
        else:
            redis_settings = redis_settings.with_url(url)
        return cls(redis_settings, prefix=prefix, settings=settings, datastreams=datastreams)

    @property
    def closed(self) -> bool:
        """True once closing began: no new calls or takes (held requests are still answered
        until the shutdown timeout)."""
        return self._closing or self._closed

    @property
    def stats(self) -> QueueStats:
        return QueueStats(
            redis_commands=self._io.commands,
            round_trips=self._io.round_trips,
            redis_retries=self._io.retries,
            subscriptions=self._pulses.subscriptions,
            pubsub_reconnects=self._pulses.reconnects,
            pulses_received=self._router.messages,
            held_requests=len(self._held),
            heartbeats_sent=self._watch.liveness.beats_sent,
            data_loss_events=self._watch.data_loss.events,
        )

    def __init__(
        self,
        redis_settings: RedisSettings,
        *,
        prefix: str = "prq",
        settings: QueueSettings | None = None,
        datastreams: DataStreamStore | None = None,
        node_id: str | None = None,
    ) -> None:
        self.redis_settings = redis_settings
        self.settings = settings or QueueSettings()
        self.keys = KeySchema(prefix, sharded=is_cluster_url(redis_settings.url))
        self.node_id = node_id or uuid.uuid4().hex[:16]
        self.datastreams = datastreams
        #: The DataStreams and large bodies of what this node sends and receives
        #: (prq.stream_keeper).
        self._streams = StreamKeeper(datastreams, self.settings, held=self._held_data)
        self.ctx = Context(
            self.keys,
            self.settings,
            self.node_id,
            signer=Signer.from_settings(self.settings),
            bodies=self._streams,
        )
        #: Signed at_least_once requests this node holds, whose signatures it renews while
        #: it holds them, so that they can be handed out again however long it ran them.
        self._renewals = Renewals(
            self.settings.heartbeat_initial_delay_s, self.settings.signature_renewal_s()
        )
        #: Markers of the large bodies (prq.bodies) of held requests: deleted once answered.
        self._held_bodies: dict[str, bytes] = {}
        #: Requests this node took and has not answered: id → PendingRequest (owner token).
        self._held: dict[str, PendingRequest] = {}
        #: What this node took lately, by sequence number: a second hand-out of the same one
        #: can only come from a Redis that went back in time, and must not run (prq.taken).
        self._taken = TakenRequests()
        #: at_least_once requests this node ran, and their answers (prq.ran).
        self._ran = RanRequests()
        #: Take tokens whose take failed on the client side (it may still run in Redis): the
        #: next take of the endpoint uses one, so what it was handed is collected, not orphaned.
        self._spare_tokens: dict[str, list[str]] = {}
        #: Endpoints this node took from after checking they hold no previous-layout lanes.
        self._layout_checked: set[str] = set()
        #: Take tokens that may be parked, or hold hand-offs this node never collected: token
        #: → endpoint, from the take's start until it returns (a take cut short by shutdown
        #: stays here, and closing withdraws its park and gives back what it was handed).
        self._taking: dict[str, str] = {}

        self._closed = False
        #: Closing began: new calls and takes are refused, answers still go out.
        self._closing = False
        #: Ids of held requests a `serve` handler is working on (closing waits for these).
        self._serving: set[str] = set()

    # -- checking the server at start --------------------------------------------------------

    @staticmethod
    def _server_check_steps() -> list[list[Call]]:
        """INFO, read at start to judge the server's configuration (one step)."""
        return [[Call(args) for args in INFO_CALLS]]

    def _server_checked(self, info: list[Reply] | PrqError) -> None:
        """Warn loudly when Redis evicts keys or persists data (see prq.health); the watch
        re-reads INFO at every data-loss check and warns again only about what is new."""
        self._watch.server_checked(info)

    @property
    def redis_warnings(self) -> list[str]:
        """Why this Redis would defeat prq's guarantees (eviction, persistence), as last read."""
        return list(self._watch.server_warnings)

    # -- building and checking what goes to Redis -------------------------------------------

    def build_request(
        self,
        endpoint: str,
        method: str,
        params: JsonValue = None,
        *,
        service: str = "",
        priority: int = 0,
        producer: str | None = None,
        request_id: str | None = None,
        delivery: Delivery = "at_most_once",
    ) -> Request:
        fields: dict[str, object] = {
            "endpoint": endpoint,
            "method": method,
            "params": params,
            "service": service,
            "priority": priority,
            "producer": producer or self.node_id,
            "delivery": delivery,
        }
        if request_id is not None:
            fields["id"] = request_id
        return Request(**fields)

    def _encode_request(self, request: Request) -> tuple[Request, bytes]:
        validate_endpoint(request.endpoint)
        if request.producer is None:
            request = request.model_copy(update={"producer": self.node_id})
        body = encode_stored_request(request)
        self._check_size(body, "request", request.id)
        return request, body

    def _encode_response(self, response: Response) -> bytes:
        body = response.model_dump_json().encode()
        self._check_size(body, "response", response.id)
        return body

    @staticmethod
    def _data_spent(request: Request, body: bytes, error: BaseException | None) -> bool:
        """Whether a finished call's data beside Redis (DataStreams, a large body) can be
        deleted by its caller: only when the request never ran and never will (withdrawn,
        refused). A receiver deletes it once its answer was accepted; a dead-lettered request
        keeps it for a replay until its expiry, and the sweep removes whatever is left then."""
        return (
            (is_spilled(body) or bool(request.streams))
            and isinstance(error, PrqError)
            and not error.maybe_executed
            and not isinstance(error, (QueueUnavailable, QueueShutdown))
        )

    def _check_size(self, body: bytes, what: str, request_id: str) -> None:
        check_body_size(body, self.settings.max_body_bytes, what, request_id)

    def _pickup_timeout(self, pickup_timeout_s: float | None) -> float:
        return self.settings.pickup_timeout_s if pickup_timeout_s is None else pickup_timeout_s

    def _open_items(
        self, endpoint: str, items: list[TakenItem]
    ) -> Flow[tuple[dict[str, bytes | SerializationError], dict[str, bytes]]]:
        """Taken items' request JSON by id, or why it cannot be had: the signature checked
        (with a signing key; an expired one under the request's renewal, if a node renewed
        it), and bodies kept beside Redis read back off the event loop; and the markers of
        those (prq.bodies), by id."""
        opened: dict[str, bytes | SerializationError] = {}
        expired: list[tuple[TakenItem, SignatureError]] = []
        for item in items:
            try:
                opened[item.request_id] = self._open_request(endpoint, item)
            except SerializationError as exc:
                if isinstance(exc, SignatureError) and exc.reason == "expired":
                    expired.append((item, exc))
                else:
                    opened[item.request_id] = exc
        if expired:
            opened.update((yield from self._open_renewed(endpoint, expired)))
        spilled = [(i, d) for i, d in opened.items() if isinstance(d, bytes) and is_spilled(d)]
        if spilled:
            loaded = yield Offload(partial(self._streams.load_request_bodies, spilled))
            assert isinstance(loaded, dict)
            opened.update(loaded)
        return opened, dict(spilled)

    def _adopt(
        self,
        endpoint: str,
        token: str,
        items: list[TakenItem],
        opened: dict[str, bytes | SerializationError],
    ) -> Adopted:
        """Turn taken items into PendingRequests; set apart the undecodable ones, the ids of
        ones delivered a second time (to be cancelled, not run), and redeliveries of
        at_least_once requests this node ran already (never run twice)."""
        good: list[PendingRequest] = []
        bad: list[tuple[TakenItem, SerializationError]] = []
        refused: list[str] = []
        ran: list[TakenItem] = []
        created: list[int] = []
        now = time.monotonic()  # (a take's items arrived together)
        life = self._watch.data_loss.life(endpoint, now)
        for item in items:
            try:
                data = opened[item.request_id]
                if isinstance(data, SerializationError):
                    raise data
                request = decode_stored_request(data, endpoint, item.request_id)
                self._streams.bind(request.streams, delete_after_read=False)
            except SerializationError as exc:
                logger.warning(
                    "undecodable request skipped endpoint=%r request_id=%s error=%s",
                    endpoint,
                    item.request_id,
                    exc,
                )
                bad.append((item, exc))
                continue
            if not self._first_delivery(endpoint, item, life):
                refused.append(item.request_id)
                continue
            if request.delivery == "at_least_once" and not self._first_run(endpoint, item, life):
                ran.append(item)
                continue
            delivery = checked_model(  # (an int, a hex digest: nothing to check)
                DeliveryInfo,
                {"attempt": item.attempt, "delivery_hash": delivery_hash(endpoint, request.id)},
            )
            pending = PendingRequest(request, delivery, token)
            tracing.picked_up(request, item.created_ms, self.node_id)
            self._held[request.id] = pending
            if self.ctx.signer is not None and request.delivery == "at_least_once":
                self._renewals.hold(request.id, endpoint, item.body, now)
            self._watch.hold(pending, now)
            good.append(pending)
            created.append(item.created_ms)
        metrics.taken(endpoint, created)
        return Adopted(good, bad, refused, ran)

    def _first_delivery(self, endpoint: str, item: TakenItem, life: int) -> bool:
        """Remember a take; False if this node took the same hand-out before (the same
        sequence number in this life of the endpoint's counter, the same id, an attempt not
        later): a Redis that went back in time handed it out again, and it must not run. Data
        loss is declared, unless it was already when that Redis was met (prq.taken)."""
        epoch = self._watch.data_loss.epoch_of(endpoint)
        verdict = self._taken.take(
            endpoint, item.sequence, item.request_id, item.attempt, life, epoch
        )
        if verdict == "again":
            self._watch.declare_data_loss(
                f"request {item.request_id} was handed out again (sequence {item.sequence}, "
                f"attempt {item.attempt})",
                self._watch.data_loss.scope_of(endpoint),
            )
        elif verdict == "again_after_loss":
            logger.warning(
                "request handed out again after data loss refused request_id=%s sequence=%d",
                item.request_id, item.sequence,
            )  # fmt: skip
        return verdict == "first"

    def _first_run(self, endpoint: str, item: TakenItem, life: int) -> bool:
        """Remember that this node runs an at_least_once request; False if it ran (or runs)
        the same one before: a redelivery (attempt 2 or later), not to be run again."""
        generation = (self._watch.data_loss.epoch_of(endpoint), life)
        return self._ran.first_run(
            endpoint, item.sequence, item.request_id, item.attempt, generation
        )

    def _ran_again(self, endpoint: str, token: str, item: TakenItem) -> Flow[None]:
        """A redelivery of an at_least_once request this node ran or runs: never run it again.
        Still running: the run answers under the new owner token. Answered before: the same
        answer again. Its answer no longer kept: an error saying so (not retryable)."""
        request_id = item.request_id
        running = self._held.get(request_id)
        if running is not None:
            logger.info("redelivery of a running request adopted request_id=%s", request_id)
            running.owner_token = token
            self._watch.beat_soon(request_id, time.monotonic())
            return
        body = self._ran.response(request_id)
        if body is None:
            error = ServerError(
                type="DuplicateDelivery",
                message=f"request {request_id} was handed out again to a receiver that ran it "
                "already and no longer keeps its response; it was not run again",
            )
            body = Response(id=request_id, error=error).model_dump_json().encode()
        logger.info("redelivery of a request run before answered request_id=%s", request_id)
        outcome = yield from respond_flow(self.ctx, endpoint, request_id, token, body)
        if outcome not in ("ok", "replay"):
            logger.warning("answer dropped request_id=%s outcome=%s", request_id, outcome)

    def _receive_flow(
        self,
        endpoint: str,
        channel: str,
        max_items: int,
        timeout_s: float,
        should_stop: Callable[[], bool] | None,
        current: list[str],
    ) -> Flow[list[PendingRequest]]:
        """Take requests (waiting for the first), and deal with what must not run: requests a
        rolled-back Redis handed out again are cancelled, undecodable ones are answered with an
        error. Returns what the handler may run. `current` gets the token of the take under
        way, so a driver whose take is cut short can give back what it got (`_unpark_flow`).
        The node's first take of an endpoint checks its layout first (flows.layout_flow)."""
        yield from self._check_layout_flow(endpoint)
        while True:
            if self._watch.presence.took(endpoint, time.monotonic()):
                self._watch.wake()
            token = self._take_token(endpoint)
            floor = self._watch.data_loss.floor(endpoint, time.monotonic())
            sent_epoch = self._watch.data_loss.epoch
            self._taking[token] = endpoint
            current[:] = [token]
            try:
                with self._router.watch_take(channel, token) as signal:
                    result = yield from take_flow(
                        self.ctx, endpoint, token, signal, max_items, timeout_s, should_stop
                    )
            except PrqError:
                self._take_failed(endpoint, token)
                raise
            self._taking.pop(token, None)
            current.clear()
            if result.redelivered:
                metrics.REDELIVERED.labels(endpoint).inc(result.redelivered)
            good: list[PendingRequest] = []
            if self._rolled_back(endpoint, floor, sent_epoch, result):
                refused = [item.request_id for item in result.items]
            else:
                items, ghosts = self._without_ghosts(endpoint, result.items, result.counter)
                opened, markers = yield from self._open_items(endpoint, items)
                adopted = self._adopt(endpoint, result.token, items, opened)
                for pending in adopted.good:
                    if pending.id in markers:
                        self._held_bodies[pending.id] = markers[pending.id]
                good, refused = adopted.good, adopted.refused + ghosts
                for item in adopted.ran:
                    yield from self._ran_again(endpoint, result.token, item)
                for item, exc in adopted.bad:
                    # kept first, so whoever sees the error answer finds the dead letter
                    yield Exec((
                        dead_letter_call(
                            self.ctx, endpoint, item.request_id, item.body,
                            self._dead_reason(exc), item.attempt,
                        ),
                    ))  # fmt: skip
                    metrics.DEAD_LETTERED.labels(endpoint).inc()
                    yield from respond_flow(
                        self.ctx, endpoint, item.request_id, result.token,
                        self._bad_item_response(item, exc),
                    )  # fmt: skip
            for request_id in refused:
                yield from cancel_flow(self.ctx, request_id, endpoint, "data_loss")
            if good or not result.items:
                return good

    def _without_ghosts(
        self, endpoint: str, items: list[TakenItem], counter: int | None
    ) -> tuple[list[TakenItem], list[str]]:
        """Set apart the taken items queued before a loss this node declared (their ids): the
        Redis that lost data may hand them out though they ran already (data_loss: ghosts), so
        they are cancelled, not run; their callers, if any still wait, get DataLoss. `counter`:
        the take's reading of the enqueue counter."""
        up_to = self._watch.data_loss.ghosts_for_take(endpoint, counter)
        if not up_to:
            return items, []
        kept: list[TakenItem] = []
        ghosts: list[str] = []
        for item in items:
            if 0 < item.sequence <= up_to:
                ghosts.append(item.request_id)
            else:
                kept.append(item)
        if ghosts:
            logger.warning(
                "requests queued before a data loss refused endpoint=%r count=%d",
                endpoint, len(ghosts),
            )  # fmt: skip
        return kept, ghosts

    def _check_layout_flow(self, endpoint: str) -> Flow[None]:
        """Once per endpoint (until it passes): refuse one that holds the previous scheduling
        layout (flows.layout_flow; ConfigurationError)."""
        if endpoint not in self._layout_checked:
            yield from layout_flow(self.ctx, endpoint)
            self._layout_checked.add(endpoint)

    def _take_token(self, endpoint: str) -> str:
        spare = self._spare_tokens.get(endpoint)
        return spare.pop() if spare else new_token()

    def _take_failed(self, endpoint: str, token: str) -> None:
        self._spare_tokens.setdefault(endpoint, []).append(token)

    def _rolled_back(
        self, endpoint: str, floor: Floor | None, sent_epoch: int, result: TakeResult
    ) -> bool:
        """A take saw the enqueue counter lower than known (and vouched for) before it was
        sent (in epoch `sent_epoch`): Redis went back in time, and what it handed out may have
        run already. Declare data loss (True)."""
        if result.counter is None:
            return False
        now = time.monotonic()
        watch = self._watch.data_loss
        reason = watch.read(endpoint, floor, result.counter, now, sent_epoch)
        if reason:
            self._watch.declare_data_loss(reason, watch.scope_of(endpoint))
            # (the first reading after it: it was taken after the loss, which it showed)
            watch.read(endpoint, None, result.counter, now, watch.epoch)
            return True
        return False

    def _held_data(self) -> list[str]:
        """Store references of the DataStreams and large bodies of the requests this node
        holds: they are kept for as long as it holds them (StreamKeeper.sweep)."""
        references = [
            stream.reference
            for pending in list(self._held.values())
            for stream in pending.request.streams.values()
            if stream.reference is not None
        ]
        markers = list(self._held_bodies.values())
        return references + [parse_body(marker).reference for marker in markers]

    def _holds(self, request_id: str) -> bool:
        """Whether this node holds the request, i.e. took it and has not answered it (an
        answer to anything else is dropped, with a warning)."""
        if request_id in self._held:
            return True
        logger.warning("response for a request this node does not hold request_id=%s", request_id)
        return False

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

    def _answer_ttl_s(self, request_id: str) -> float:
        """How long the answer to a held request is kept: what it asked for, within this
        node's bounds (QueueSettings.response_ttl_for)."""
        pending = self._held.get(request_id)
        asked = pending.request.response_ttl_s if pending is not None else None
        return self.settings.response_ttl_for(asked)

    def _notify_flow(
        self, request: Request, body: bytes, pickup_timeout_s: float | None
    ) -> Flow[str]:
        """Queue a one-way message (a detached request whose answer is not kept), in one round
        trip with the endpoint's registry entry on this node's first use of it (and a locator
        with `request_locators`); its id. A known id is not queued again."""
        settings = self.settings
        pickup_s = self._pickup_timeout(pickup_timeout_s)
        now_ms = int(time.time() * 1000)
        attempts = settings.max_attempts if request.delivery == "at_least_once" else 0
        if self.ctx.signer is not None:
            valid_s = settings.signature_ttl_s(pickup_s, max(1, attempts))
            body = self.ctx.signer.sign("request", request.id, request.endpoint, body,
                                        now_ms + int(valid_s * 1000))  # fmt: skip
        call = enqueue_many_call(
            self.keys.endpoint(request.endpoint), uuid.uuid4().hex, [(request.id, body)], now_ms,
            int(pickup_s * 1000), int(settings.request_ttl_s(pickup_s) * 1000),
            int(settings.list_ttl_s * 1000), request.priority, request.producer or self.node_id,
            attempts, one_way=True,
        )  # fmt: skip
        beside = locator_calls(self.keys, settings, request.id, request.endpoint, pickup_s)
        yield from self._check_layout_flow(request.endpoint)
        if self._first_use(request.endpoint):
            beside += registry_calls(self.keys, settings, [request.endpoint], now_ms)
        replies = yield Exec((call, *beside))
        assert isinstance(replies, list)
        self._watch.presence.sent(request.endpoint, time.monotonic())
        outcome = parse_enqueue_many(replies[0], 1)
        if outcome.refused_ids:
            raise QueueFull(
                f"endpoint {request.endpoint!r} is at its max_pending: message {request.id} "
                "was not queued; try again later"
            )
        if outcome.accepted:
            metrics.series(request.endpoint).enqueued.inc()
        return request.id

    def _first_use(self, endpoint: str) -> bool:
        """Whether this node has not used `endpoint` lately: its first enqueue then registers
        the endpoint in the same round trip (later ones leave it to the presence reports), so
        the admin view lists it, and status and cancel by id find its requests, even if this
        process exits right after sending."""
        return endpoint not in self._watch.presence.used

    def _serving_held(self) -> bool:
        """Whether a `serve` handler still works on a held request that can be answered (what
        closing waits for; a request dequeued by hand is given back at once)."""
        return any(
            (pending := self._held.get(request_id)) is not None and not pending.cancelled
            for request_id in list(self._serving)
        )

    def _hand_back_flow(self) -> Flow[int]:
        """On shutdown, give back every request still held: at_least_once ones are queued
        again for another receiver, at_most_once ones cancelled ("receiver_shutdown", their
        callers told at once). Their PendingRequests are cancelled ("shutdown"). The same for
        what was handed to a take cut short by the shutdown (its park is withdrawn first, so
        nothing more comes). How many."""
        uncollected = yield from self._unpark_flow(list(self._taking))
        held = list(self._held.values())
        if not held:
            return uncollected
        redelivery = Redelivery.of(self.settings)
        given = [(p.request.endpoint, p.id, p.owner_token) for p in held]
        calls = tuple(
            hand_back_call(self.keys.endpoint(endpoint), request_id, token, redelivery)
            for endpoint, request_id, token in given
        )
        replies = yield Exec(calls)
        assert isinstance(replies, list)
        for (_, request_id, _), reply in zip(given, replies, strict=True):
            state = reply.decode() if isinstance(reply, bytes) else str(reply)
            pending = self._held.pop(request_id, None)
            self._held_bodies.pop(request_id, None)  # queued again, or its caller deletes it
            logger.warning(
                "held request given back on shutdown request_id=%s collected=%s state=%s",
                request_id, pending is not None, state,
            )  # fmt: skip
            if pending is not None:
                pending.mark_cancelled("shutdown")
            self._watch.liveness.release(request_id)
        return uncollected + len(given)

    def _unpark_flow(self, tokens: list[str]) -> Flow[int]:
        """Withdraw the parks of takes that will never return what they got, in one round trip,
        and give that back (unpark.lua: it never ran, so it goes to another receiver, its
        attempt not counted); how many requests went back."""
        taking = [(t, endpoint) for t in tokens if (endpoint := self._taking.pop(t, None))]
        for token, endpoint in taking:  # never used again: its receipt goes
            spare = self._spare_tokens.get(endpoint, [])
            if token in spare:
                spare.remove(token)
        if not taking:
            return 0
        redelivery = Redelivery.of(self.settings)
        calls = tuple(
            unpark_call(self.keys.endpoint(endpoint), token, redelivery)
            for token, endpoint in taking
        )
        replies = yield Exec(calls)
        assert isinstance(replies, list)
        given = sum(parse_unpark(reply) for reply in replies)
        if given:
            logger.info("requests handed to takes cut short given back count=%d", given)
        return given

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

    def _open_renewed(
        self, endpoint: str, expired: list[tuple[TakenItem, SignatureError]]
    ) -> Flow[dict[str, bytes | SerializationError]]:
        """Taken items whose signature expired, checked under their renewals (one round
        trip): the request JSON by id, or the expiry error where no valid renewal is found."""
        signer = self.ctx.signer
        assert signer is not None  # (only a signer finds a signature expired)
        keys = self.keys.endpoint(endpoint)
        replies = yield Exec(tuple(Call(("GET", keys.renewal(i.request_id))) for i, _ in expired))
        assert isinstance(replies, list)
        opened: dict[str, bytes | SerializationError] = {}
        for (item, error), renewal in zip(expired, replies, strict=True):
            opened[item.request_id] = error
            if isinstance(renewal, bytes):
                with contextlib.suppress(SignatureError):
                    renewed = signer.renewed(item.body, renewal)
                    opened[item.request_id] = signer.open(
                        "request", item.request_id, endpoint, renewed
                    )
        return opened

    def _renewal_due(self, now: float) -> bool:
        """Whether a held request's signature is due for renewal (the facade's watch loop
        then runs `_renew_flow`)."""
        return bool(self._renewals.due(now, self._watch.liveness.held.__contains__))

    def _renew_flow(self) -> Flow[None]:
        """Renew the signatures of the signed requests this node holds that are due, in one
        round trip (prq.signing.Renewals): each is valid twice the renewal period from now."""
        signer = self.ctx.signer
        now = time.monotonic()
        due = self._renewals.due(now, self._watch.liveness.held.__contains__)
        if signer is None or not due:
            return
        valid_ms = int(2 * self._renewals.every_s * 1000)
        until_ms = self.ctx.wall_ms() + valid_ms
        ttl_ms = valid_ms + int(self.settings.signing_clock_skew_s * 1000)
        calls: list[Call] = []
        renewed: dict[str, bytes | None] = {}
        for request_id, endpoint, envelope in due:
            try:
                header = signer.renewal("request", request_id, endpoint, envelope, until_ms)
            except SignatureError as exc:  # (its key retired meanwhile: it expires in time)
                logger.warning("signature not renewed request_id=%s error=%s", request_id, exc)
                renewed[request_id] = None
                continue
            key = self.keys.endpoint(endpoint).renewal(request_id)
            calls.append(Call(("SET", key, header, "PX", ttl_ms)))
            renewed[request_id] = signer.renewed(envelope, header)
        if calls:
            yield Exec(tuple(calls))
        self._renewals.renewed(renewed, now)

    def _open_request(self, endpoint: str, item: TakenItem) -> bytes:
        """A taken request's JSON: its signature checked (SignatureError when it fails) with
        a signing key, its envelope dropped without one."""
        signer = self.ctx.signer
        if signer is None:
            return unwrap(item.body)
        return signer.open("request", item.request_id, endpoint, item.body)

    @staticmethod
    def _dead_reason(exc: SerializationError) -> str:
        """Why an item that must not run is dead-lettered."""
        if isinstance(exc, SignatureError):
            return f"signature {exc.reason}: {exc}"
        return f"undecodable: {exc}"

    @staticmethod
    def _bad_item_response(item: TakenItem, exc: SerializationError) -> bytes:
        error = ServerError(type=type(exc).__name__, message=str(exc)[:500])
        return Response(id=item.request_id, error=error).model_dump_json().encode()

    @staticmethod
    def _result(request: Request, response: Response) -> JsonValue:
        if response.error is not None:
            raise RemoteError(response.error, request_id=request.id, endpoint=request.endpoint)
        return response.result

    # -- calls in flight ------------------------------------------------------------------------

    @staticmethod
    def _cancelled(endpoint: str) -> None:
        """A cancel() of this node cancelled a request of `endpoint`."""
        metrics.CANCELLED.labels(endpoint).inc()

    def _enqueued(
        self,
        endpoint: str,
        sent_epoch: int,
        counter: int | None,
        then: Callable[[], None] | None = None,
    ) -> None:
        """An enqueue step of this node, sent in epoch `sent_epoch` (or later), answered:
        `counter` is the endpoint's enqueue counter, None when the id was known already
        (nothing enqueued); then `then` is called."""
        if counter is not None:
            metrics.ENQUEUED.labels(endpoint).inc()
            self._watch.observe_counter(endpoint, counter, sent_epoch)
        if then is not None:
            then()

    @staticmethod
    def _redelivered(endpoint: str, state: str) -> None:
        """A call of this node handed its at_least_once request out again ("queued"), or
        dead-lettered it with its attempts used up ("cancelled")."""
        metrics.REDELIVERED.labels(endpoint).inc()
        if state == "cancelled":
            metrics.DEAD_LETTERED.labels(endpoint).inc()

    def _sending(
        self, request: Request, on_progress: Callable[[int, int], None] | None = None
    ) -> None:
        self._watch.send(request.id, request.endpoint, time.monotonic(), on_progress)

    def _sent_endpoint(self, request_id: str) -> str | None:
        lease = self._watch.liveness.sent.get(request_id)
        return lease.endpoint if lease is not None else None

    def _check_epoch(self, epoch: tuple[str, int] | None) -> None:
        """Raise DataLoss if the node declared data loss where the call's endpoint lives since
        the call began (`epoch`: NodeWatch.epoch_of)."""
        if epoch is not None and not self._watch.same_epoch(epoch):
            raise DataLoss(
                "Redis lost or rolled back its data while this call was in flight; the request "
                "may or may not have run. Retry if it is safe (the same request id is fine)."
            )

    @staticmethod
    def _shutdown_error(sent: bool = False) -> QueueShutdown:
        """QueueShutdown for a step cut short by closing; `sent`: it had sent something to
        Redis already (a call's request may be enqueued and may run, so maybe_executed)."""
        if not sent:
            return QueueShutdown(
                "the queue was closed before the call reached Redis; nothing was sent. Retry "
                "elsewhere."
            )
        return QueueShutdown(
            "the queue was closed while the call was waiting; its request may have been "
            "enqueued and may still run. Retrying elsewhere with the same request id is safe "
            "(it is never enqueued twice).",
            maybe_executed=True,
        )
