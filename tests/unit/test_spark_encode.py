"""Rows to request JSON (prq.spark._encode): what a receiver decodes is what the row held."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
from typing import Any

import pytest

from prq.core.models import decode_stored_request
from prq.spark import SparkQueueConfig
from prq.spark._encode import Chunk, arrow_chunks, row_chunks

pa = pytest.importorskip("pyarrow")
Row: Any = pytest.importorskip("pyspark.sql").Row

LIMIT = 1_000_000


def config(**overrides: Any) -> SparkQueueConfig:
    fields: dict[str, Any] = {
        "url": "redis://127.0.0.1:1/0",
        "endpoint": 'poll://spark "quoted" é',
        "method": "score",
        "namespace": "job-1",
        "key_column": "key",
    }
    return SparkQueueConfig(**(fields | overrides))


def decoded(chunks: list[Chunk]) -> dict[str, Any]:
    out = {}
    for chunk in chunks:
        for rid, body in zip(chunk.ids, chunk.bodies, strict=True):
            request = decode_stored_request(body, 'poll://spark "quoted" é', rid)
            assert request.method == "score"
            assert request.producer == "bulk"
            out[rid] = request.params
    return out


TIME = dt.datetime(2026, 11, 21, 12, 30, 5, 123000)
COLUMNS: dict[str, list[Any]] = {
    "key": [1, 2, 3],
    "n": [5, None, -(2**62)],
    "x": [3.0, float("nan"), 0.1],
    "inf": [float("inf"), -0.0, 1e300],
    "flag": [True, None, False],
    "s": ["plain", 'quote " back \\ nl \n tab \t', None],
    "u": ["é 漢字 \u2028", "", "ok"],
    "when": [TIME, None, TIME],
    "day": [TIME.date(), TIME.date(), None],
    "amount": [decimal.Decimal("12.34"), None, decimal.Decimal("-0.50")],
    "raw": [b"\x00\xff", None, b""],
    "tags": [["a", "b"], [], None],
    "attrs": [{"k": 1}, None, {}],
}
EXPECTED = {
    "job-1:1": {
        "n": 5, "x": 3.0, "inf": None, "flag": True, "s": "plain", "u": "é 漢字 \u2028",
        "when": TIME.isoformat(), "day": "2026-11-21", "amount": "12.34", "raw": "AP8=",
        "tags": ["a", "b"], "attrs": {"k": 1},
    },
    "job-1:2": {
        "n": None, "x": None, "inf": -0.0, "flag": None, "s": "quote \" back \\ nl \n tab \t",
        "u": "", "when": None, "day": "2026-11-21", "amount": None, "raw": None, "tags": [],
        "attrs": None,
    },
    "job-1:3": {
        "n": -(2**62), "x": 0.1, "inf": 1e300, "flag": False, "s": None, "u": "ok",
        "when": TIME.isoformat(), "day": None, "amount": "-0.50", "raw": "", "tags": None,
        "attrs": {},
    },
}  # fmt: skip


def arrow_batch() -> Any:
    types = {"attrs": pa.map_(pa.string(), pa.int64()), "when": pa.timestamp("us")}
    return pa.RecordBatch.from_pydict(
        {name: pa.array(values, types.get(name)) for name, values in COLUMNS.items()}
    )


def test_arrow_rows_decode_to_their_values() -> None:
    got = decoded(list(arrow_chunks(config(), [arrow_batch()], LIMIT)))
    assert got == EXPECTED
    assert isinstance(got["job-1:1"]["x"], float)  # 3.0 stays a float, not 3
    assert math.copysign(1, got["job-1:2"]["inf"]) == -1


def test_spark_rows_decode_to_the_same_values() -> None:
    names = list(COLUMNS)
    rows = [Row(**{n: COLUMNS[n][i] for n in names}) for i in range(3)]
    assert decoded(list(row_chunks(config(), rows, LIMIT))) == EXPECTED


@pytest.mark.parametrize("source", ["arrow", "rows"])
def test_bad_keys_and_big_bodies_are_set_aside_not_sent(source: str) -> None:
    keys = ["ok-1", "bad key", None, "", "big", "x" * 200, "ok-2"]
    blobs = ["a", "a", "a", "a", "b" * 5000, "a", "a"]
    cfg = config(batch_size=3)
    if source == "arrow":
        batch = pa.RecordBatch.from_pydict({"key": keys, "blob": blobs})
        chunks = list(arrow_chunks(cfg, [batch], 4000))
    else:
        rows = [Row(key=k, blob=b) for k, b in zip(keys, blobs, strict=True)]
        chunks = list(row_chunks(cfg, rows, 4000))
    assert [c.rows for c in chunks] == [3, 3, 1]
    assert sorted(decoded(chunks)) == ["job-1:ok-1", "job-1:ok-2"]
    invalid = [rid for c in chunks for rid, _ in c.invalid]
    assert invalid == ["job-1:bad key", "job-1:None", "job-1:", f"job-1:{'x' * 200}"]
    assert [(rid, size > 4000) for c in chunks for rid, size in c.too_large] == [
        ("job-1:big", True)
    ]


def test_params_columns_pick_and_order_the_params() -> None:
    batch = pa.RecordBatch.from_pydict({"key": [7], "a": [1], "b": ["two"], "c": [3.5]})
    chunk = next(arrow_chunks(config(params_columns=("c", "a")), [batch], LIMIT))
    assert json.loads(chunk.bodies[0])["p"] == {"c": 3.5, "a": 1}
    with pytest.raises(ValueError, match="params columns"):
        list(arrow_chunks(config(params_columns=("zz",)), [batch], LIMIT))
    with pytest.raises(ValueError, match="key column"):
        list(arrow_chunks(config(key_column="nope"), [batch], LIMIT))


def test_float_and_binary_keys_make_no_ids() -> None:
    batch = pa.RecordBatch.from_pydict({"key": [1.5, 2.0], "v": [1, 2]})
    chunk = next(arrow_chunks(config(), [batch], LIMIT))
    assert chunk.ids == [] and len(chunk.invalid) == 2


@pytest.mark.parametrize("delivery", ["at_most_once", "at_least_once"])
def test_the_delivery_mode_travels_in_every_body(delivery: str) -> None:
    cfg = config(delivery=delivery, priority=-3, producer="night")
    rows = [Row(key=1, n=5), Row(key=2, n=6)]
    chunks = [
        *arrow_chunks(cfg, [pa.RecordBatch.from_pydict({"key": [1], "n": [5]})], LIMIT),
        *row_chunks(cfg, rows, LIMIT),
    ]
    requests = [
        decode_stored_request(body, cfg.endpoint, rid)
        for chunk in chunks
        for rid, body in zip(chunk.ids, chunk.bodies, strict=True)
    ]
    assert len(requests) == 3
    assert {(r.delivery, r.priority, r.producer) for r in requests} == {(delivery, -3, "night")}


def test_an_unknown_delivery_mode_is_refused_when_the_job_is_configured() -> None:
    with pytest.raises(ValueError, match="delivery must be one of at_most_once, at_least_once"):
        config(delivery="exactly_once")


def test_a_job_without_params_columns_sends_requests_without_params() -> None:
    cfg = config(params_columns=())
    batch = pa.RecordBatch.from_pydict({"key": [1, 2], "ignored": ["a", "b"]})
    rows = [Row(key=3, ignored="c")]
    chunks = [*arrow_chunks(cfg, [batch], LIMIT), *row_chunks(cfg, rows, LIMIT)]
    assert decoded(chunks) == {f"job-1:{k}": {} for k in (1, 2, 3)}


@pytest.mark.parametrize(
    ("fields", "asked"),
    [
        ({}, None),
        ({"response_ttl_s": 30}, 30.0),
        ({"queue_settings": {"response_ttl_s": 5}}, 5.0),
        ({"response_ttl_s": 30, "queue_settings": {"response_ttl_s": 5}}, 30.0),
    ],
)
def test_the_answer_lifetime_a_job_asks_for_travels_in_every_body(
    fields: dict[str, Any], asked: float | None
) -> None:
    cfg = config(**fields)
    batch = pa.RecordBatch.from_pydict({"key": [1], "n": [5]})
    chunks = [*arrow_chunks(cfg, [batch], LIMIT), *row_chunks(cfg, [Row(key=2, n=6)], LIMIT)]
    requests = [
        decode_stored_request(body, cfg.endpoint, rid)
        for chunk in chunks
        for rid, body in zip(chunk.ids, chunk.bodies, strict=True)
    ]
    assert [r.response_ttl_s for r in requests] == [asked, asked]


@pytest.mark.parametrize("ttl", [0, -2.0, float("inf"), float("nan")])
def test_a_job_answer_lifetime_that_is_not_positive_and_finite_is_refused(ttl: float) -> None:
    with pytest.raises(ValueError, match="response_ttl_s must be positive and finite"):
        config(response_ttl_s=ttl)
