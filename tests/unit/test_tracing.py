"""prq.observe.tracing's propagation, in one process and without a tracer provider: a span made
current by hand (as a service that extracted its caller's context has one) is what gets passed on.

(The spans themselves, across processes and with the SDK, are in
tests/integration/test_tracing.py.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from prq.bulk import BulkClient
from prq.core.config import QueueSettings
from prq.core.models import Request, decode_stored_request
from prq.observe import tracing
from prq.spark import SparkQueueConfig
from prq.spark._encode import arrow_chunks

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
SPAN_ID = 0xB7AD6B7169203331
PARENT = f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"
#: A traceparent of the caller's own (another trace).
OWN = "00-11111111111111111111111111111111-2222222222222222-01"
ENDPOINT = "poll://traced"


@pytest.fixture
def in_span() -> Iterator[None]:
    """A current span (not recorded: no provider) with a valid context."""
    context = SpanContext(TRACE_ID, SPAN_ID, is_remote=True, trace_flags=TraceFlags(1))
    with trace.use_span(NonRecordingSpan(context)):
        yield


def test_a_request_sent_outside_any_span_is_left_alone() -> None:
    request = Request(endpoint=ENDPOINT, method="m")
    sent, traced = tracing.sending(request, "node", call=True)
    assert sent is request and sent.headers == {}
    with traced:  # (hooks that do nothing)
        assert traced.then(None) is None
    assert tracing.carrier() == ()


@pytest.mark.usefixtures("in_span")
def test_a_request_sent_in_a_span_carries_its_context_and_the_callers_headers_win() -> None:
    request = Request(endpoint=ENDPOINT, method="m", headers={"tenant": "a"})
    sent, traced = tracing.sending(request, "node")
    with traced:
        assert sent.headers["traceparent"] == PARENT  # (no provider: the current span's)
        assert sent.headers["tenant"] == "a"
    own = Request(endpoint=ENDPOINT, method="m", headers={"traceparent": OWN})
    sent, traced = tracing.sending(own, "node", call=True)
    with traced:
        assert sent.headers == {"traceparent": OWN}


def test_with_trace_never_mixes_a_callers_parent_with_another_state() -> None:
    trace_headers = {"traceparent": PARENT, "tracestate": "k=v"}
    assert tracing.with_trace({}, trace_headers) == trace_headers
    assert tracing.with_trace({"traceparent": OWN}, trace_headers) == {"traceparent": OWN}
    assert tracing.with_trace({"tracestate": "mine=1"}, trace_headers) == {
        "traceparent": PARENT, "tracestate": "mine=1"
    }  # fmt: skip
    headers = {"a": "b"}
    assert tracing.with_trace(headers, {}) is headers


@pytest.mark.usefixtures("in_span")
def test_bulk_requests_carry_the_batch_context_unless_they_name_their_own() -> None:
    bulk = BulkClient.from_url("redis://127.0.0.1:1/0", settings=QueueSettings())
    try:
        plain = Request(endpoint=ENDPOINT, method="m", id="plain", params={"x": 1})
        own = Request(endpoint=ENDPOINT, method="m", id="own", headers={"traceparent": OWN})
        trace_headers, traced = tracing.sending_batch()
        with traced:
            by_lane, rejected = bulk._encode_batch([plain, own], trace_headers)
    finally:
        bulk.close()
    assert rejected == []
    (items,) = by_lane.values()
    headers = {rid: decode_stored_request(body, ENDPOINT, rid).headers for rid, body in items}
    assert headers == {"plain": {"traceparent": PARENT}, "own": {"traceparent": OWN}}


@pytest.mark.usefixtures("in_span")
def test_spark_rows_carry_the_drivers_context() -> None:
    pa = pytest.importorskip("pyarrow")
    cfg = SparkQueueConfig(
        url="redis://127.0.0.1:1/0", endpoint=ENDPOINT, method="m", namespace="job",
        key_column="key",
    ).for_run()  # fmt: skip
    assert dict(cfg.trace_headers) == {"traceparent": PARENT}
    batch = pa.RecordBatch.from_pydict({"key": [1, 2], "v": ["a", "b"]})
    (chunk,) = arrow_chunks(cfg, [batch], 1_000_000)
    for rid, body in zip(chunk.ids, chunk.bodies, strict=True):
        request = decode_stored_request(body, ENDPOINT, rid)
        assert request.headers == {"traceparent": PARENT}
        assert json.loads(body)["p"] == request.params
