"""Wire models: what travels through Redis, always as JSON (never pickle).

A request moves through these states (`RequestState`):

    queued ──take──▶ taken ──apply_response──▶ done
       │                 │
       └─withdraw─▶ withdrawn   (pickup timeout, or cancel before pickup)
                         └─cancel─▶ cancelled

`done`, `withdrawn` and `cancelled` are final; a response that arrives after a final state is
dropped. `unknown` means Redis holds nothing for the id (never enqueued, expired, or lost).
"""

from __future__ import annotations

import enum
import os
import re
import string
import threading
from typing import Annotated, Any, Literal, TypeVar, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from prq.core.errors import (
    InvalidEndpoint,
    InvalidRequest,
    PayloadTooLarge,
    SerializationError,
    typed_validation,
)
from prq.datastreams import DataStream

__all__ = [
    "DELIVERY_MODES",
    "MAX_ENDPOINT_LENGTH",
    "MAX_PRIORITY",
    "MAX_PRODUCER_LENGTH",
    "MIN_PRIORITY",
    "DeliveryInfo",
    "PendingRequest",
    "Request",
    "RequestState",
    "RequestStatus",
    "Response",
    "ServerError",
    "StoredRequest",
    "check_body_size",
    "decode_request",
    "decode_response",
    "decode_stored_request",
    "encode_stored_request",
    "readable_endpoint",
    "validate_endpoint",
]

#: Longest endpoint name accepted (characters); longer names are rejected, never truncated.
MAX_ENDPOINT_LENGTH = 200
#: Priorities are 32-bit signed integers.
MIN_PRIORITY, MAX_PRIORITY = -(2**31), 2**31 - 1
#: Longest producer name.
MAX_PRODUCER_LENGTH = 200
#: Request ids: what a uuid4, a uuid5 or a caller's own stable key looks like. No `|`, which
#: separates fields in pulses, and nothing that needs escaping in a key.
REQUEST_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$"
_REQUEST_ID_RE = re.compile(REQUEST_ID_PATTERN)

Delivery = Literal["at_most_once", "at_least_once"]


def _empty(value: object) -> bool:
    return not value


def _unset(value: object) -> bool:
    return value is None


#: The constraints a Request and its stored form (StoredRequest) share.
Method = Annotated[str, Field(min_length=1, max_length=200)]
Priority = Annotated[int, Field(ge=MIN_PRIORITY, le=MAX_PRIORITY)]
Producer = Annotated[str, Field(max_length=MAX_PRODUCER_LENGTH)]

#: The name of a DataStream in a message.
StreamName = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.\-]+$")]
#: The delivery modes, as text.
DELIVERY_MODES: tuple[Delivery, ...] = get_args(Delivery)


def validate_endpoint(endpoint: object) -> str:
    """Return `endpoint` if it is a valid name for new work, else raise InvalidEndpoint.

    A valid name is 1-200 printable characters (`str.isprintable`: no control characters,
    line breaks or tabs) that neither start nor end with whitespace. prq does not parse it:
    `poll://billing-7`, `billing-7` and `poll://` are three different, valid names (the scheme
    is a convention). Names already in Redis are read with the looser `readable_endpoint`."""
    endpoint = readable_endpoint(endpoint)
    if endpoint != endpoint.strip():
        raise InvalidEndpoint(
            f"endpoint {endpoint!r} starts or ends with whitespace; a name that differs only "
            "in its spaces would be another endpoint: remove them"
        )
    return endpoint


def readable_endpoint(endpoint: object) -> str:
    """Return `endpoint` if it is 1-200 printable characters, else raise InvalidEndpoint: what
    earlier versions took for a name, so names they left in Redis (e.g. with a leading space)
    can still be read, shown and forgotten, while new work is refused them
    (`validate_endpoint`)."""
    if not isinstance(endpoint, str):
        raise InvalidEndpoint(f"endpoint must be a string, not {type(endpoint).__name__}")
    if not 1 <= len(endpoint) <= MAX_ENDPOINT_LENGTH:
        raise InvalidEndpoint(
            f"endpoint must be 1-{MAX_ENDPOINT_LENGTH} characters, got {len(endpoint)}"
        )
    if not endpoint.isprintable():
        bad = next(c for c in endpoint if not c.isprintable())
        raise InvalidEndpoint(
            f"endpoint {endpoint!r} has a non-printable character {bad!r}; "
            "use printable characters only"
        )
    return endpoint


#: The alphabet of the ids prq makes: letters and digits only, so an id is URL-safe, needs no
#: escaping in a key or a log line, and starts with a letter or digit (REQUEST_ID_PATTERN).
_ID_ALPHABET = string.digits + string.ascii_uppercase + string.ascii_lowercase
#: Characters of an id prq makes: 22 random ones of 62 hold about 131 bits, more than a uuid4.
COMPACT_ID_LENGTH = 22
#: Random byte -> id character (byte % 62: the first 8 characters come 5 times in 256, the
#: others 4 times, which costs each character 0.004 of its 5.95 bits).
_ID_TABLE = bytes(ord(_ID_ALPHABET[b % len(_ID_ALPHABET)]) for b in range(256))


def new_request_id() -> str:
    """A fresh random request id: 22 letters and digits from the OS's random source (one
    urandom call and one table lookup per character: a call makes one, so it stays cheap)."""
    return os.urandom(COMPACT_ID_LENGTH).translate(_ID_TABLE).decode("ascii")


class ServerError(BaseModel):
    """What a service raised, as carried in `Response.error`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: str
    message: str
    details: JsonValue = None
    retryable: bool = False


class Request(BaseModel):
    """One call to a polling service's `method` at `endpoint`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    endpoint: str
    method: Method
    params: JsonValue = None
    service: str = ""
    id: Annotated[str, Field(default_factory=new_request_id, pattern=REQUEST_ID_PATTERN)]
    #: Higher is taken first; lower levels keep a share (README, "Scheduling").
    priority: Priority = 0
    #: Who queued it: producers take turns within one priority (default: the sending node).
    producer: Producer | None = None
    delivery: Delivery = "at_most_once"
    headers: dict[str, str] = Field(default_factory=dict)
    #: Binary payloads kept beside Redis, by name (prq.datastreams); left out of the JSON
    #: when there are none.
    streams: dict[StreamName, DataStream] = Field(default_factory=dict, exclude_if=_empty)
    #: How long its answer is kept once stored, seconds (a detached request's reader, e.g. a
    #: Spark job, may come back later). None: the receiver's response_ttl_s. A receiver keeps
    #: it at most its max_response_ttl_s (QueueSettings.response_ttl_for).
    response_ttl_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = Field(
        default=None, exclude_if=_unset
    )

    def __init__(self, **data: Any) -> None:
        # Raise typed errors, not pydantic's ValidationError: InvalidEndpoint for a bad
        # endpoint, InvalidRequest (also a ValueError) for any other field. Validation that
        # does not go through here (model_validate, FastAPI's bodies) is pydantic's own.
        if "endpoint" in data:
            validate_endpoint(data["endpoint"])
        with typed_validation(InvalidRequest, "Request"):
            super().__init__(**data)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        return validate_endpoint(value)


class Response(BaseModel):
    """The outcome of a request: `result`, or `error` when the service raised."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: Annotated[str, Field(pattern=REQUEST_ID_PATTERN)]
    result: JsonValue = None
    error: ServerError | None = None
    #: Binary payloads kept beside Redis, by name (prq.datastreams); left out of the JSON
    #: when there are none.
    streams: dict[StreamName, DataStream] = Field(default_factory=dict, exclude_if=_empty)


class RequestState(enum.StrEnum):
    """Where a request is in its life (see the module docstring)."""

    QUEUED = "queued"
    TAKEN = "taken"
    DONE = "done"
    WITHDRAWN = "withdrawn"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"


class RequestStatus(BaseModel):
    """A snapshot of one request, as `status(request_id)` reports it."""

    model_config = ConfigDict(frozen=True)

    id: str
    state: RequestState
    endpoint: str | None = None
    reason: str | None = None
    attempt: int = 0
    created_ms: int | None = None
    taken_ms: int | None = None
    done_ms: int | None = None


class DeliveryInfo(BaseModel):
    """Which attempt this is, and a hash that stays the same on every attempt."""

    model_config = ConfigDict(frozen=True)

    attempt: int = 1
    delivery_hash: str


def check_body_size(body: bytes, limit: int, what: str, request_id: str) -> None:
    """Refuse a body over `limit` bytes (max_body_bytes) before anything is written."""
    if len(body) > limit:
        raise PayloadTooLarge(
            f"{what} {request_id} is {len(body)} bytes, over max_body_bytes={limit}; "
            "nothing was written",
            size_bytes=len(body),
            limit_bytes=limit,
        )


def decode_request(raw: bytes | str) -> Request:
    """Parse a request's whole JSON (`Request.model_dump_json`); raise SerializationError on
    anything that is not one."""
    try:
        return Request.model_validate_json(raw)
    except (ValidationError, ValueError) as exc:
        raise SerializationError(f"stored request is not valid: {exc}") from exc


class StoredRequest(BaseModel):
    """A request as its record keeps it: only what the record's key does not say (the endpoint
    and the id), under one-letter names, with every field at its default left out. So
    `{"m":"resize","p":{"w":64}}` is a call of `resize` with those params, priority 0, no
    producer named, at_most_once, no service, headers or streams, and no asked response TTL
    (`k`, seconds). `decode_stored_request` rebuilds the Request with the endpoint and id the
    record's key names."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # (each field checked as Request checks it, with the same types: decode_stored_request
    # builds the Request without checking them again)
    m: Method
    p: JsonValue = None
    s: str = ""
    q: Priority = 0
    r: Producer | None = None
    d: Delivery = "at_most_once"
    k: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    h: dict[str, str] = Field(default_factory=dict)
    x: dict[StreamName, DataStream] = Field(default_factory=dict)


#: JSON of a stored request's fields, as the models write JSON values.
_stored_json = TypeAdapter(dict[str, JsonValue]).serializer.to_json


def encode_stored_request(request: Request) -> bytes:
    """The bytes a record keeps for `request` (StoredRequest). Without DataStreams the JSON is
    written straight from the fields by the serializer of JSON values (as the model writes
    them: NaN and infinities as null), a tenth of the cost of building the model to dump it;
    with them, through the model, which knows how a DataStream is written."""
    if request.streams:
        stored = StoredRequest.model_construct(
            m=request.method, p=request.params, s=request.service, q=request.priority,
            r=request.producer, d=request.delivery, k=request.response_ttl_s, h=request.headers,
            x=request.streams,
        )  # fmt: skip
        return stored.model_dump_json(exclude_defaults=True).encode()
    fields: dict[str, object] = {"m": request.method}
    if request.params is not None:
        fields["p"] = request.params
    if request.service:
        fields["s"] = request.service
    if request.priority:
        fields["q"] = request.priority
    if request.producer is not None:
        fields["r"] = request.producer
    if request.delivery != "at_most_once":
        fields["d"] = request.delivery
    if request.response_ttl_s is not None:
        fields["k"] = request.response_ttl_s
    if request.headers:
        fields["h"] = request.headers
    return _stored_json(fields)


_M = TypeVar("_M", bound=BaseModel)


def checked_model(cls: type[_M], values: dict[str, Any]) -> _M:
    """A model built from `values` that were already checked as the model checks them, one
    value for each of its fields: what `model_construct` builds, without its pass over the
    fields for defaults (a fifth of its cost; a receiver builds two per request it takes)."""
    if len(values) != len(cls.__pydantic_fields__):
        return cls.model_construct(**values)
    model = _new(cls)
    _set(model, "__dict__", values)
    _set(model, "__pydantic_fields_set__", set(values))
    _set(model, "__pydantic_extra__", None)
    _set(model, "__pydantic_private__", None)
    return model


_new, _set = object.__new__, object.__setattr__


def decode_stored_request(raw: bytes | str, endpoint: str, request_id: str) -> Request:
    """The request a record for `request_id` at `endpoint` keeps: a StoredRequest, or the whole
    JSON of a Request (as an earlier prq wrote it) that must name that id and endpoint; raise
    SerializationError on anything else."""
    head = raw[:16] if isinstance(raw, bytes) else raw[:16].encode()
    if head.startswith(b'{"endpoint":'):  # a whole Request: its JSON starts with its endpoint
        request = decode_request(raw)
        if request.id != request_id or request.endpoint != endpoint:
            raise SerializationError(f"stored request {request_id} names another id or endpoint")
        return request
    try:
        stored = StoredRequest.model_validate_json(raw)
        readable_endpoint(endpoint)  # a name an earlier version took is still read
    except (ValidationError, ValueError, InvalidEndpoint) as exc:
        raise SerializationError(f"stored request {request_id} is not valid: {exc}") from exc
    if not _REQUEST_ID_RE.match(request_id):
        raise SerializationError(f"stored request id {request_id!r} is not a valid request id")
    # Every field was checked as Request checks it (StoredRequest's fields, the endpoint, the
    # id): building it unchecked saves validating the params a second time.
    return checked_model(Request, {
        "endpoint": endpoint, "method": stored.m, "params": stored.p, "service": stored.s,
        "id": request_id, "priority": stored.q, "producer": stored.r, "delivery": stored.d,
        "headers": stored.h, "streams": stored.x, "response_ttl_s": stored.k,
    })  # fmt: skip


def decode_response(raw: bytes | str) -> Response:
    """Parse a stored response; raise SerializationError on anything that is not one."""
    try:
        return Response.model_validate_json(raw)
    except (ValidationError, ValueError) as exc:
        raise SerializationError(f"stored response is not valid: {exc}") from exc


#: Guards the making of a PendingRequest's cancellation event against its setting (rare,
#: brief: one lock for all of them costs less than one per request).
_CANCEL_LOCK = threading.Lock()


class PendingRequest:
    """A request a receiver has taken: the request, its delivery and its cancellation signal.

    `owner_token` proves to Redis that this receiver holds the request; `apply_response`
    presents it, so a receiver that lost the request can no longer answer it.
    """

    __slots__ = ("_cancel_reason", "_cancelled", "delivery", "owner_token", "request")

    def __init__(self, request: Request, delivery: DeliveryInfo, owner_token: str) -> None:
        self.request = request
        self.delivery = delivery
        self.owner_token = owner_token
        # made by the first wait_cancelled (most requests are never waited on that way)
        self._cancelled: threading.Event | None = None
        self._cancel_reason: str | None = None

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def cancelled(self) -> bool:
        """True once the request was cancelled (by its caller, or because a node was lost)."""
        return self._cancel_reason is not None

    @property
    def cancel_reason(self) -> str | None:
        """Why it was cancelled: `cancelled`, `sender_lost`, `data_loss`, ...; None if not."""
        return self._cancel_reason

    def mark_cancelled(self, reason: str) -> None:
        """Signal cancellation; the first reason sticks."""
        with _CANCEL_LOCK:
            if self._cancel_reason is not None:
                return
            self._cancel_reason = reason
            event = self._cancelled
        if event is not None:
            event.set()

    def wait_cancelled(self, timeout_s: float | None = None) -> bool:
        """Block until cancelled or `timeout_s` passes; True if cancelled."""
        with _CANCEL_LOCK:
            event = self._cancelled
            if event is None:
                event = self._cancelled = threading.Event()
                if self._cancel_reason is not None:
                    event.set()
        return event.wait(timeout_s)

    def __repr__(self) -> str:
        return (
            f"PendingRequest(id={self.id!r}, endpoint={self.request.endpoint!r}, "
            f"method={self.request.method!r}, attempt={self.delivery.attempt})"
        )
