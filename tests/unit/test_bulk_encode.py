"""BulkClient's fast request encoding: the stored bodies are byte for byte what
`encode_stored_request` writes for the request with its producer filled in, they decode to
that request, and the lanes, rejections and order are what encoding each request through its
model gives (no Redis here: the client connects lazily and nothing is sent)."""

from __future__ import annotations

import json
import re
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prq.bulk import BULK_PRODUCER, BulkClient, Lane, new_batch_nonce
from prq.core import bodies
from prq.core.config import QueueSettings
from prq.core.errors import InvalidEndpoint, PayloadTooLarge, SerializationError
from prq.core.models import (
    MAX_PRIORITY,
    MIN_PRIORITY,
    Request,
    decode_stored_request,
    encode_stored_request,
)
from prq.core.names import REQUEST_ID_PATTERN
from prq.datastreams import DataStream, FileSystemStore

SETTINGS = QueueSettings(max_body_bytes=2000, inline_limit_bytes=1000)


#: For the property test (hypothesis runs each example without the fixtures): never connects.
ANY_CLIENT = BulkClient.from_url("redis://127.0.0.1:1/0", settings=QueueSettings())


@pytest.fixture
def bulk() -> Iterator[BulkClient]:
    client = BulkClient.from_url("redis://127.0.0.1:1/0", settings=SETTINGS)
    yield client
    client.close()


def with_producer(request: Request) -> Request:
    if request.producer is None:
        return request.model_copy(update={"producer": BULK_PRODUCER})
    return request


def stored_body(request: Request) -> bytes:
    """What the body is without the fast path: the model copied with the producer, encoded."""
    return encode_stored_request(with_producer(request))


def expected(
    bulk: BulkClient, batch: list[Request]
) -> tuple[dict[Lane, list[tuple[str, bytes]]], list[tuple[str, type]]]:
    """The lanes and rejections of the encoding through the models (BulkClient._encode)."""
    by_lane: dict[Lane, list[tuple[str, bytes]]] = {}
    rejected = []
    for request in batch:
        try:
            rid, body = bulk._encode(request)
        except (InvalidEndpoint, PayloadTooLarge, SerializationError) as exc:
            rejected.append((request.id, type(exc)))
            continue
        assert body == stored_body(request)
        if type(request) is Request and re.fullmatch(REQUEST_ID_PATTERN, rid):
            # it reads back as the request with its producer
            decoded = decode_stored_request(body, request.endpoint, rid)
            assert decoded.model_dump_json() == with_producer(request).model_dump_json()
        lane = (
            request.endpoint,
            request.priority,
            request.producer or BULK_PRODUCER,
            bulk._attempts(request.delivery),
        )
        by_lane.setdefault(lane, []).append((rid, bytes(body)))
    return by_lane, rejected


def _bytes(body: str | bytes) -> bytes:
    return body.encode() if isinstance(body, str) else bytes(body)


def assert_same(bulk: BulkClient, batch: list[Request]) -> None:
    by_lane, rejected = bulk._encode_batch(batch)
    want_lanes, want_rejected = expected(bulk, batch)
    assert {
        lane: [(rid, _bytes(body)) for rid, body in items] for lane, items in by_lane.items()
    } == want_lanes
    assert [(r.request_id, type(r.error)) for r in rejected] == want_rejected


PARAMS: list[Any] = [
    None,
    True,
    False,
    0,
    -17,
    2**63 - 1,
    -(2**63),
    2**64 + 5,
    10**40,
    1.5,
    -0.0,
    1e300,
    5e-324,
    0.1,
    float("nan"),
    float("inf"),
    float("-inf"),
    "",
    "plain",
    'quote " backslash \\ slash / tab \t newline \n nul \x00 del \x7f',
    "unicode: é ß 中文 🎉 \u2028 \u2029 \ufeff",
    [],
    {},
    [1, "two", 3.0, None, [True, {"k": []}]],
    {"a": 1, "é": {"nested": [1.25, "x"]}, "": None, 'k"\\': "v"},
    {"producer": None, "delivery": "at_most_once", "headers": {}},
]


@pytest.mark.parametrize("params", PARAMS, ids=range(len(PARAMS)))
def test_params_of_every_json_type(bulk: BulkClient, params: Any) -> None:
    assert_same(bulk, [Request(endpoint="poll://e", method="m", params=params)])


def test_fields_of_every_kind(bulk: BulkClient) -> None:
    stored = DataStream(length=3, stream_id="0" * 32, reference="ref:abc")
    assert stored.stored
    batch = [
        Request(endpoint="poll://e", method="m"),
        Request(endpoint="poll://e", method="m", id="run-7:key.1_x"),
        Request(endpoint='poll://é "q" \\ 中', method='méthode "x"', params={"a": 1}),
        Request(endpoint="poll://e", method="m", service="billing", params=[1]),
        Request(endpoint="poll://e", method="m", service='s "quoted" ü'),
        Request(endpoint="poll://e", method="m", priority=MAX_PRIORITY),
        Request(endpoint="poll://e", method="m", priority=MIN_PRIORITY),
        Request(endpoint="poll://e", method="m", priority=-3),
        Request(endpoint="poll://e", method="m", priority=True),  # validated to 1
        Request(endpoint="poll://e", method="m", producer="tenant-ü"),
        Request(endpoint="poll://e", method="m", producer=""),  # lane "bulk", body ""
        Request(endpoint="poll://e", method="m", producer=BULK_PRODUCER),
        Request(endpoint="poll://e", method="m", delivery="at_least_once"),
        Request(endpoint="poll://e", method="m", delivery="at_least_once", producer="p"),
        Request(endpoint="poll://e", method="m", headers={"trace": "t-1"}),
        Request(endpoint="poll://e", method="m", headers={"ü": '\n"', "b": "", "a": "x"}),
        Request(endpoint="poll://e", method="m", streams={"blob": stored}),
        Request(endpoint="poll://other", method="m", params={"x": "y"}),
        Request(endpoint="poll://e", method="m", response_ttl_s=5),
        Request(endpoint="poll://e", method="m", response_ttl_s=0.125, headers={"h": "v"}),
        Request(endpoint="poll://e", method="m", response_ttl_s=1e9, delivery="at_least_once"),
    ]
    assert_same(bulk, batch)


def test_requests_the_fast_path_leaves_to_the_models(bulk: BulkClient) -> None:
    class Tagged(Request):
        tag: str = "t"

    no_params = Request(endpoint="poll://e", method="m", headers={"h": "v"})
    unstored = Request(endpoint="poll://e", method="m", streams={"s": DataStream.from_bytes(b"x")})
    bad_endpoint = Request.model_construct(endpoint="", method="m", id="no-endpoint")
    too_large = Request(endpoint="poll://e", method="m", params="x" * 3000)
    batch = [Tagged(endpoint="poll://e", method="m"), no_params, too_large]  # type: ignore[call-arg]
    assert_same(bulk, batch)
    by_lane, rejected = bulk._encode_batch([unstored, bad_endpoint, too_large])
    assert not by_lane
    assert [type(r.error) for r in rejected] == [
        SerializationError,
        InvalidEndpoint,
        PayloadTooLarge,
    ]
    assert [r.request_id for r in rejected] == [unstored.id, "no-endpoint", too_large.id]


def test_an_id_that_needs_escaping_among_plain_ones(bulk: BulkClient) -> None:
    """Ids are checked a batch at a time; one that fails sends the batch through the check of
    each id, and only that request through the models."""
    odd = [
        Request.model_construct(endpoint="poll://e", method="m", id=rid, params=i)
        for i, rid in enumerate(['quote"', "back\\slash", "new\nline", "é", "x\x00", "ok\n"])
    ]
    plain = [Request(endpoint="poll://e", method="m", params=i) for i in range(5)]
    batch = [plain[0], odd[0], plain[1], odd[1], plain[2], *odd[2:], *plain[3:]]
    assert_same(bulk, batch)
    by_lane, _ = bulk._encode_batch(batch)
    for items in by_lane.values():
        for _, body in items:
            assert json.loads(body)["m"] == "m"  # valid JSON (the id is the key's, not in it)


def test_lanes_keep_batch_order(bulk: BulkClient) -> None:
    batch = [
        Request(endpoint=f"poll://e{i % 3}", method="m", priority=i % 2, params=i)
        for i in range(60)
    ]
    assert_same(bulk, batch)
    by_lane, _ = bulk._encode_batch(batch)
    assert list(by_lane) == list(expected(bulk, batch)[0])


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
printable = st.text(st.characters(codec="utf-8").filter(str.isprintable), min_size=1, max_size=30)
#: Endpoint names: printable, without the outer whitespace a name may not have.
endpoints = printable.filter(lambda name: name == name.strip())


@settings(max_examples=200, deadline=None)
@given(
    params=json_values,
    endpoint=endpoints,
    method=printable,
    service=st.text(max_size=20),
    priority=st.integers(MIN_PRIORITY, MAX_PRIORITY),
    producer=st.none() | st.text(max_size=20),
    delivery=st.sampled_from(["at_most_once", "at_least_once"]),
    headers=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
    response_ttl_s=st.none() | st.floats(min_value=0.001, max_value=1e12),
    explicit_id=st.none()
    | st.text(string.ascii_letters + string.digits + "_.:-", min_size=1, max_size=40),
)
def test_any_request(
    params: Any,
    endpoint: str,
    method: str,
    service: str,
    priority: int,
    producer: str | None,
    delivery: str,
    headers: dict[str, str],
    response_ttl_s: float | None,
    explicit_id: str | None,
) -> None:
    ids = {} if explicit_id is None or explicit_id[0] in "_.:-" else {"id": explicit_id}
    request = Request(
        endpoint=endpoint,
        method=method,
        params=params,
        service=service,
        priority=priority,
        producer=producer,
        delivery=delivery,
        headers=headers,
        response_ttl_s=response_ttl_s,
        **ids,
    )
    assert_same(ANY_CLIENT, [request])


def test_batch_nonces_are_short_and_fresh() -> None:
    nonces = {new_batch_nonce() for _ in range(10_000)}
    assert len(nonces) == 10_000
    for nonce in nonces:
        assert len(nonce) == 11
        assert set(nonce) <= set(string.ascii_letters + string.digits + "-_")


def test_large_encoded_bodies_of_either_form_go_beside_redis(tmp_path: Path) -> None:
    """enqueue_encoded takes stored requests (prq.spark writes the lean StoredRequest form) or
    a Request's whole JSON: a large body of either form is spilled to the store; a body that is
    neither goes as it is."""
    settings = QueueSettings(max_body_bytes=100_000, inline_limit_bytes=1000)
    store = FileSystemStore(tmp_path)
    client = BulkClient.from_url("redis://127.0.0.1:1/0", settings=settings, datastreams=store)
    try:
        request = Request(endpoint="poll://e", method="m", params="x" * 2000, id="big")
        lean, whole = encode_stored_request(request), request.model_dump_json().encode()
        garbage = b"{" * 2000
        items = [("big", lean), ("big", whole), ("big", garbage), ("big", b'{"m":"m"}')]
        spilled = client._spilled("poll://e", items, 60.0)
    finally:
        client.close()
    assert [bodies.is_spilled(_bytes(body)) for _, body in spilled] == [True, True, False, False]
    assert [body for _, body in spilled[2:]] == [garbage, b'{"m":"m"}']
