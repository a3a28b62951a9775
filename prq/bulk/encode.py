"""Encoding requests for a bulk enqueue (BulkEncoding): each Request becomes its stored body
(what `encode_stored_request` writes, built from JSON pieces its batch shares), sorted into the
lanes one script call each writes, and the requests that cannot be sent are set aside before
anything is written."""

from __future__ import annotations

import re
from collections.abc import Sequence
from operator import itemgetter

from pydantic import JsonValue, TypeAdapter
from pydantic_core import to_json

from prq.bulk.base import BulkBase
from prq.bulk.results import Rejected
from prq.core.errors import PrqError, SerializationError
from prq.core.models import (
    DELIVERY_MODES,
    Delivery,
    Request,
    check_body_size,
    encode_stored_request,
)
from prq.core.names import REQUEST_ID_PATTERN, validate_endpoint
from prq.observe import tracing

__all__ = ["BULK_PRODUCER", "BulkEncoding", "Encoded", "Lane"]

#: The producer named in detached requests that do not name one.
BULK_PRODUCER = "bulk"
#: Where a batch's requests queue: (endpoint, priority, producer, max attempts: 0 for
#: at_most_once); one script call each.
Lane = tuple[str, int, str, int]
#: Encoded requests by lane, and the requests refused before any write: one round trip's worth.
Encoded = tuple[dict[Lane, list[tuple[str, str | bytes]]], list["Rejected"]]
#: What the requests of a batch with the same endpoint, method, service, priority, producer and
#: delivery share: their JSON around the params, the id and the headers, and their lane's list.
Shape = tuple[bytes, bytes, list[tuple[str, str | bytes]]]
#: An id that needs no JSON escaping, as a validated Request's (fullmatch: no trailing newline
#: slips through `$`); and ids of only such characters, checked a batch at a time.
_PLAIN_ID = re.compile(REQUEST_ID_PATTERN).fullmatch
_PLAIN_ID_CHARS = re.compile(r"[A-Za-z0-9_.:\-]*").fullmatch
#: The fields that make a request's shape (see BulkClient._shape), read from its __dict__.
_shape_key = itemgetter(
    "endpoint", "method", "service", "priority", "producer", "delivery", "response_ttl_s"
)
#: Request.params' JSON, by the serializer of its type (NaN and infinities as null, as the
#: models write them; pydantic_core.to_json alone would write NaN).
_params_json = TypeAdapter(JsonValue).serializer.to_json


class BulkEncoding(BulkBase):
    """How a BulkClient turns Requests into stored bodies by lane."""

    def _attempts(self, delivery: Delivery) -> int:
        """The attempts a request of `delivery` gets (0: at_most_once, never handed out again)."""
        return self.settings.max_attempts if delivery == "at_least_once" else 0

    def _encode_batch(
        self,
        batch: Sequence[Request],
        trace: dict[str, str] | None = None,
        *,
        check_ids: bool = False,
    ) -> Encoded:
        """The batch's stored bodies by lane, and the requests refused before any write.

        Each body is the bytes of `encode_stored_request` of the request with its producer
        filled in, built from JSON pieces shared by the requests of a shape (see `_shape`) and
        one serializer call for its params (and one for its headers when it has any): no model
        copy, no validation again. A request the pieces do not spell (a Request subclass, one
        with streams, one whose id needs escaping: built without validation) goes through
        `_encode`. Ids are checked all at once; when one fails, the batch is encoded again
        with each id checked. `trace`: the trace context each request carries (with_trace).
        """
        rejected: list[Rejected] = []
        by_lane: dict[Lane, list[tuple[str, str | bytes]]] = {}
        shapes: dict[tuple[object, ...], Shape | None] = {}
        limit = self.settings.max_body_bytes
        join = b"".join
        ids: list[str] = []
        for request in batch:
            if type(request) is Request:
                fields = request.__dict__  # what the attributes read, without their lookup
                rid = fields["id"]
                if not fields["streams"] and (not check_ids or _PLAIN_ID(rid)):
                    key = _shape_key(fields)
                    try:
                        shape = shapes[key]
                    except KeyError:
                        shape = shapes[key] = self._shape(request, by_lane)
                    if shape is not None:
                        head, tail, items = shape
                        params, headers = fields["params"], fields["headers"]
                        if trace:
                            headers = tracing.with_trace(headers, trace)
                        body = join((
                            head, b"" if params is None else b',"p":' + _params_json(params),
                            tail, b',"h":' + to_json(headers) if headers else b"", b"}",
                        ))  # fmt: skip
                        if len(body) <= limit:
                            items.append((rid, body))
                            ids.append(rid)
                            continue
            try:
                encoded = self._encode(request, trace)
            except PrqError as exc:
                rejected.append(Rejected(request.id, exc))
                continue
            attempts = self._attempts(request.delivery)
            lane = (request.endpoint, request.priority, request.producer or BULK_PRODUCER, attempts)
            by_lane.setdefault(lane, []).append(encoded)
        if not check_ids and not _PLAIN_ID_CHARS("".join(ids)):
            return self._encode_batch(batch, trace, check_ids=True)
        return {lane: items for lane, items in by_lane.items() if items}, rejected

    def _shape(
        self, request: Request, by_lane: dict[Lane, list[tuple[str, str | bytes]]]
    ) -> Shape | None:
        """The JSON pieces and the lane's list of the requests with the endpoint, method,
        service, priority, producer, delivery and asked response TTL of `request`, or None
        when they are not what a validated Request holds. The stored form's fields, in its
        JSON's order (models.StoredRequest): m (method), p (params, left out when None), then s
        (service), q (priority), r (producer), d (delivery), k (response TTL), each left out at
        its default, and h (headers, left out when empty); the pieces are what comes before the
        params and what comes between them and the headers."""
        endpoint, method, service = request.endpoint, request.method, request.service
        priority, producer, delivery = request.priority, request.producer, request.delivery
        keep = request.response_ttl_s
        if not (
            type(endpoint) is str and type(method) is str and type(service) is str
            and type(priority) is int and (producer is None or type(producer) is str)
            and delivery in DELIVERY_MODES and (keep is None or type(keep) is float)
        ):  # fmt: skip
            return None
        try:
            validate_endpoint(endpoint)
        except PrqError:
            return None  # _encode raises it, for each request
        lane = (endpoint, priority, producer or BULK_PRODUCER, self._attempts(delivery))
        head = b'{"m":%b' % to_json(method)
        tail = b"".join((
            b',"s":%b' % to_json(service) if service else b"",
            b',"q":%d' % priority if priority else b"",
            b',"r":%b' % to_json(BULK_PRODUCER if producer is None else producer),
            b',"d":%b' % to_json(delivery) if delivery != "at_most_once" else b"",
            b',"k":%b' % to_json(keep) if keep is not None else b"",
        ))  # fmt: skip
        return head, tail, by_lane.setdefault(lane, [])

    def _encode(
        self, request: Request, trace: dict[str, str] | None = None
    ) -> tuple[str, str | bytes]:
        validate_endpoint(request.endpoint)
        if any(not stream.stored for stream in request.streams.values()):
            raise SerializationError(
                f"request {request.id} carries DataStreams: the bulk client does not store "
                "them; send it through a queue given a DataStreamStore"
            )
        if request.producer is None:
            request = request.model_copy(update={"producer": BULK_PRODUCER})
        if trace:
            headers = tracing.with_trace(request.headers, trace)
            if headers is not request.headers:
                request = request.model_copy(update={"headers": headers})
        body = encode_stored_request(request)
        check_body_size(body, self.settings.max_body_bytes, "request", request.id)
        return request.id, body
