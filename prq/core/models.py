"""Wire models: what travels through Redis, always as JSON (never pickle): a Request, its
Response (with the ServerError a service raised), and a request's stored form (StoredRequest),
with their encoding and decoding.

Endpoint names and request ids are checked by prq.core.names; a request's states, its status
and a taken request are in prq.core.lifecycle.
"""

from __future__ import annotations

import re
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
    ServerError,
    typed_validation,
)
from prq.core.names import REQUEST_ID_PATTERN, new_request_id, readable_endpoint, validate_endpoint
from prq.datastreams import DataStream

__all__ = [
    "DELIVERY_MODES",
    "MAX_PRIORITY",
    "MAX_PRODUCER_LENGTH",
    "MIN_PRIORITY",
    "Request",
    "Response",
    "ServerError",
    "StoredRequest",
    "check_body_size",
    "decode_request",
    "decode_response",
    "decode_stored_request",
    "encode_stored_request",
]

#: Priorities are 32-bit signed integers.
MIN_PRIORITY, MAX_PRIORITY = -(2**31), 2**31 - 1
#: Longest producer name.
MAX_PRODUCER_LENGTH = 200
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
    #: it at most its max_response_ttl_s (QueueSettings.response_ttl_for), and an answer a
    #: caller waits for at least waited_response_ttl_s, so that a caller that missed its pulse
    #: reads it at its next poll (a shorter lifetime would make that caller find it gone).
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
