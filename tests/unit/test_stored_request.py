"""The form a request record keeps (models.StoredRequest): only what the record's key does not
say, defaults left out; read back whole, and the whole JSON of earlier prq versions still read."""

from __future__ import annotations

import json

import pytest

from prq import Request, SerializationError
from prq.core.models import decode_stored_request, encode_stored_request
from prq.datastreams import DataStream

E = "poll://stored"

REQUESTS = [
    Request(endpoint=E, method="m"),
    Request(endpoint=E, method="m", params={"a": [1, 2.5, None, True, "é\u2028\x00"]}),
    Request(endpoint=E, method="m", params=0),
    Request(endpoint=E, method="m", params=""),
    Request(endpoint=E, method="m", params=[]),
    Request(
        endpoint=E,
        method="x" * 200,
        params={"k": "v"},
        service="svc",
        priority=-(2**31),
        producer="p" * 200,
        delivery="at_least_once",
        headers={"h": "1", "é": "ü"},
    ),
    Request(endpoint=E, method="m", priority=2**31 - 1, producer=""),
    Request(
        endpoint=E,
        method="m",
        streams={"f": DataStream(reference="ref-1", length=3, stream_id="0" * 32)},
    ),
    Request(endpoint=E, method="m", response_ttl_s=5),
    Request(endpoint=E, method="m", response_ttl_s=0.25),
]


@pytest.mark.parametrize("request_", REQUESTS)
def test_a_request_round_trips_through_its_stored_form(request_: Request) -> None:
    stored = encode_stored_request(request_)
    whole = request_.model_dump_json()  # (a DataStream compares by identity: compare JSON)
    assert decode_stored_request(stored, E, request_.id).model_dump_json() == whole
    assert decode_stored_request(stored.decode(), E, request_.id).model_dump_json() == whole
    if not request_.streams:  # (built unchecked, it equals the Request it was made from)
        assert decode_stored_request(stored, E, request_.id) == request_
    # Neither the endpoint nor the id is stored: the record's key says them
    fields = json.loads(stored)
    assert request_.id not in stored.decode() and E not in stored.decode()
    assert set(fields) <= set("mpsqrdhxk")


def test_defaults_are_left_out() -> None:
    request = Request(endpoint=E, method="echo", params={"n": 1})
    assert encode_stored_request(request) == b'{"m":"echo","p":{"n":1}}'


def test_an_asked_response_ttl_is_kept_in_seconds_and_left_out_when_not_asked() -> None:
    asked = Request(endpoint=E, method="m", response_ttl_s=86400)
    assert encode_stored_request(asked) == b'{"m":"m","k":86400.0}'
    assert decode_stored_request(b'{"m":"m","k":5}', E, asked.id).response_ttl_s == 5
    assert "response_ttl_s" not in Request(endpoint=E, method="m").model_dump_json()


@pytest.mark.parametrize("ttl", [0, -1, float("inf"), float("nan")])
def test_a_response_ttl_that_is_not_a_positive_finite_number_is_refused(ttl: float) -> None:
    with pytest.raises(ValueError):
        Request(endpoint=E, method="m", response_ttl_s=ttl)
    with pytest.raises(SerializationError):
        decode_stored_request(b'{"m":"m","k":%s}' % json.dumps(ttl).encode(), E, "r1")


def test_the_whole_json_of_an_earlier_prq_is_read_when_it_names_this_record() -> None:
    request = Request(endpoint=E, method="m", params=[1], producer="old")
    whole = request.model_dump_json().encode()
    assert decode_stored_request(whole, E, request.id) == request
    with pytest.raises(SerializationError, match="names another id or endpoint"):
        decode_stored_request(whole, E, "another-id")
    with pytest.raises(SerializationError, match="names another id or endpoint"):
        decode_stored_request(whole, "poll://elsewhere", request.id)


@pytest.mark.parametrize(
    "raw",
    [
        b"", b"\xff\xfe", b"null", b"[]", b"{}", b'{"p":1}', b'{"m":""}', b'{"m":1}',
        b'{"m":"x","z":1}', b'{"m":"x","q":2147483648}', b'{"m":"x","q":-2147483649}',
        b'{"m":"' + b"x" * 201 + b'"}', b'{"m":"x","d":"twice"}',
        b'{"m":"x","r":"' + b"p" * 201 + b'"}', b'{"m":"x","h":{"a":1}}', b'{"endpoint":"poll:',
        b'{"m":"x","x":{"bad name":{"id":"' + b"0" * 32 + b'","length":1,"ref":"r"}}}',
        b'{"m":"x","x":{"f":{"id":"0","length":1,"ref":"r"}}}',
    ],
)  # fmt: skip
def test_anything_else_is_a_serialization_error(raw: bytes) -> None:
    with pytest.raises(SerializationError):
        decode_stored_request(raw, E, "id-1")


@pytest.mark.parametrize(
    ("endpoint", "request_id"), [(E, "bad id"), (E, "a|b"), (E, ""), ("", "id-1"), ("e\n", "id-1")]
)
def test_a_record_under_a_key_no_request_could_have_is_a_serialization_error(
    endpoint: str, request_id: str
) -> None:
    # (the endpoint and the id come from the record's key, not from its JSON)
    with pytest.raises(SerializationError):
        decode_stored_request(b'{"m":"x"}', endpoint, request_id)
