"""Wire models: validation and JSON decoding."""

from __future__ import annotations

import pickle
from collections import Counter

import pytest
from pydantic import ValidationError

from prq import (
    InvalidEndpoint,
    InvalidRequest,
    PrqError,
    Request,
    Response,
    SerializationError,
    ServerError,
)
from prq.core.lifecycle import DeliveryInfo
from prq.core.models import (
    StoredRequest,
    checked_model,
    decode_request,
    decode_response,
    decode_stored_request,
    encode_stored_request,
)
from prq.core.names import COMPACT_ID_LENGTH, new_request_id, readable_endpoint, validate_endpoint


def test_request_defaults() -> None:
    request = Request(endpoint="poll://a", method="ping")
    assert len(request.id) == COMPACT_ID_LENGTH == 22
    assert request.delivery == "at_most_once"
    assert request.priority == 0
    assert request.headers == {}


def test_ids_prq_makes_are_22_random_letters_and_digits() -> None:
    ids = [new_request_id() for _ in range(20_000)]
    assert len(set(ids)) == 20_000
    assert all(len(i) == 22 and i.isascii() and i.isalnum() for i in ids)
    # every one of the 62 characters comes, each near its share (byte % 62: the first eight a
    # quarter more often than the rest), at every position
    counts = Counter("".join(ids))
    assert len(counts) == 62
    expected = 20_000 * 22 / 62
    assert all(0.8 * expected < n < 1.4 * expected for n in counts.values())
    assert all(len({i[k] for i in ids}) == 62 for k in range(22))


def test_bad_endpoint_raises_the_typed_error() -> None:
    with pytest.raises(InvalidEndpoint):
        Request(endpoint="bad\nname", method="m")


@pytest.mark.parametrize("request_id", ["", "a|b", "a b", "x" * 129, "-leading", "é"])
def test_bad_request_ids_are_rejected(request_id: str) -> None:
    with pytest.raises(InvalidRequest, match="id"):
        Request(endpoint="poll://a", method="m", id=request_id)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"method": ""}, "method"),
        ({"method": "m", "priority": 2**40}, "priority"),
        ({"method": "m", "delivery": "twice"}, "delivery"),
        ({"method": "m", "response_ttl_s": -1}, "response_ttl_s"),
        ({"method": "m", "colour": "red"}, "colour"),
    ],
)
def test_a_refused_request_field_raises_a_prq_error(fields: dict[str, object], field: str) -> None:
    # When a Request is built with a field prq does not take, Then the error is prq's, names
    # the field, keeps pydantic's details, and `except ValueError` still catches it
    with pytest.raises(InvalidRequest) as caught:
        Request(endpoint="poll://a", **fields)
    error = caught.value
    assert isinstance(error, PrqError) and isinstance(error, ValueError)
    assert str(error).startswith("invalid Request: ") and field in str(error)
    assert [problem["loc"] for problem in error.errors()] == [(field,)]
    assert isinstance(error.__cause__, ValidationError)


def test_validating_json_stays_pydantic_s_own() -> None:
    # What FastAPI (and decode_request) rely on: model_validate raises pydantic's error
    with pytest.raises(ValidationError):
        Request.model_validate({"endpoint": "poll://a", "method": ""})


def test_request_round_trips_through_json() -> None:
    request = Request(endpoint="poll://a", method="m", params={"x": [1, 2.5, None, "s"]})
    assert decode_request(request.model_dump_json()) == request


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{",
        b"[]",
        b'{"endpoint": "poll://a"}',
        b'{"endpoint": "a\\nb", "method": "m"}',
        b'{"endpoint": "poll://a", "method": "m", "evil": 1}',
        b"!!python/object/apply:os.system ['true']",
        pickle.dumps({"endpoint": "poll://a", "method": "m"}),
        b"\xff\xfe",
    ],
)
def test_malformed_stored_requests_raise_serialization_error(raw: bytes) -> None:
    with pytest.raises(SerializationError):
        decode_request(raw)


def test_response_with_error_round_trips() -> None:
    response = Response(id="abc", error=ServerError(type="ValueError", message="no"))
    assert decode_response(response.model_dump_json()) == response


def test_malformed_response_raises_serialization_error() -> None:
    with pytest.raises(SerializationError):
        decode_response(b'{"id": 3}')


@pytest.mark.parametrize(
    "request_",
    [
        Request(endpoint="poll://a", method="echo"),
        Request(endpoint="poll://a", method="echo", params={"i": 1, "f": 1.5, "s": "é\n\u2028"}),
        Request(
            endpoint="poll://a",
            method="m",
            params=[1, 2, None, True],
            service="svc",
            priority=-3,
            producer="",
            delivery="at_least_once",
            headers={"a": "b"},
            response_ttl_s=2.5,
        ),
        Request(endpoint="poll://a", method="m", params=0, producer="p", priority=7),
    ],
)
def test_a_stored_request_is_written_as_its_model_would_write_it(request_: Request) -> None:
    through_model = StoredRequest.model_construct(
        m=request_.method, p=request_.params, s=request_.service, q=request_.priority,
        r=request_.producer, d=request_.delivery, k=request_.response_ttl_s, h=request_.headers,
        x=request_.streams,
    ).model_dump_json(exclude_defaults=True).encode()  # fmt: skip
    assert encode_stored_request(request_) == through_model
    decoded = decode_stored_request(encode_stored_request(request_), "poll://a", request_.id)
    assert decoded == request_


def test_a_model_built_from_checked_values_is_the_model_validation_builds() -> None:
    values = {
        "endpoint": "poll://a", "method": "m", "params": {"x": [1, 2.5]}, "service": "svc",
        "id": "a" * 22, "priority": 3, "producer": "p", "delivery": "at_least_once",
        "headers": {"h": "v"}, "streams": {}, "response_ttl_s": 2.5,
    }  # fmt: skip
    built = checked_model(Request, dict(values))
    validated = Request(**values)
    assert built == validated
    assert built.model_dump_json() == validated.model_dump_json()
    assert built.model_fields_set == validated.model_fields_set
    assert repr(built) == repr(validated)
    assert pickle.loads(pickle.dumps(built)) == validated  # noqa: S301 (our own bytes)
    assert built.model_copy(update={"priority": 9}).priority == 9
    with pytest.raises(ValidationError):  # frozen, as the model is
        built.priority = 1  # type: ignore[misc]
    delivery = checked_model(DeliveryInfo, {"attempt": 2, "delivery_hash": "ab"})
    assert delivery == DeliveryInfo(attempt=2, delivery_hash="ab")
    with pytest.raises(ValidationError):
        delivery.attempt = 3  # type: ignore[misc]


def test_a_model_missing_values_gets_its_defaults_as_model_construct_gives_them() -> None:
    built = checked_model(DeliveryInfo, {"delivery_hash": "ab"})
    assert built.attempt == 1
    assert built == DeliveryInfo.model_construct(delivery_hash="ab")


@pytest.mark.parametrize("endpoint", [" poll://x", "poll://x ", "\u3000poll://x", "  "])
def test_endpoint_names_with_leading_or_trailing_whitespace_are_refused(endpoint: str) -> None:
    with pytest.raises(InvalidEndpoint, match=r"whitespace|non-printable"):
        validate_endpoint(endpoint)
    with pytest.raises(InvalidEndpoint):
        Request(endpoint=endpoint, method="m")


@pytest.mark.parametrize("endpoint", ["poll://", "billing-7", "poll://a b", "x" * 200, "é"])
def test_names_prq_does_not_parse_are_valid(endpoint: str) -> None:
    # prq does not parse a name: a scheme is a convention, an inner space is part of the name
    assert validate_endpoint(endpoint) == endpoint


def test_a_name_an_earlier_version_took_is_still_read() -> None:
    # Names left in Redis by an earlier version (a leading space) are read and reach their
    # keys, so the admin views list them and an operator can forget them
    old = " poll://x"
    assert readable_endpoint(old) == old
    assert decode_stored_request(b'{"m":"run"}', old, "abc").endpoint == old
    with pytest.raises(InvalidEndpoint):
        readable_endpoint("bad\nname")
