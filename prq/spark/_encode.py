"""Rows to request bodies, without building a Request model per row.

A row becomes the stored form of a detached Request (prq.core.models.StoredRequest): {"m": method,
"p": {column: value, ...}, "r": producer[, "q": priority][, "d": delivery][, "k": response
TTL][, "h": the driver's trace context]}, which `prq.core.models.decode_stored_request` reads back
on the receiver with the endpoint and id its record's key names.
The endpoint, method and namespace are validated once per job (SparkQueueConfig); per row only
the id (REQUEST_ID_PATTERN) and the body size (max_body_bytes) are checked.

Arrow batches (mapInArrow) are encoded column by column with pyarrow.compute: ids, numbers,
booleans and strings that need no escaping become JSON text in a few vectorised calls; any other
column (a string that needs escaping, dates, decimals, binary, nested values) goes through
`json.dumps` value by value. Rows (foreachPartition) are encoded one by one with `json.dumps`.

JSON of values: NaN and infinities become null (as pydantic writes them); floats keep a
fractional part ("3.0"); dates and times become ISO 8601 text; decimals their exact text; bytes
base64; maps and structs objects; arrays lists.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prq.core.names import REQUEST_ID_PATTERN
from prq.spark._config import SparkQueueConfig, request_id

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Row

__all__ = ["Chunk", "arrow_chunks", "body_tail", "row_chunks"]

#: Characters a JSON string must escape (quote, backslash, control characters).
_NEEDS_ESCAPE = r'["\\\x00-\x1f]'
_INTEGRAL = r"^-?[0-9]+$"


@dataclass(slots=True)
class Chunk:
    """Encoded requests from up to `batch_size` rows, and the rows that cannot be requests."""

    #: Request ids and their JSON bodies, in row order.
    ids: list[str] = field(default_factory=list)
    bodies: list[str] = field(default_factory=list)
    #: Rows whose key makes no valid request id: (the id as shown, message).
    invalid: list[tuple[str, str]] = field(default_factory=list)
    #: Requests whose body is over max_body_bytes: (request id, size in bytes).
    too_large: list[tuple[str, int]] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return len(self.ids) + len(self.invalid) + len(self.too_large)


def jsonable(value: Any) -> Any:
    """`value` as something json.dumps writes (see the module docstring)."""
    if value is None or isinstance(value, str | int | bool):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        if value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
            # Arrow gives a map as a list of (key, value) tuples
            return {str(k): jsonable(v) for k, v in value}
        return [jsonable(v) for v in value]
    if hasattr(value, "asDict"):
        return jsonable(value.asDict(recursive=True))
    return str(value)


def _dumps(value: Any) -> str:
    return json.dumps(jsonable(value), ensure_ascii=False, separators=(",", ":"))


def param_columns(cfg: SparkQueueConfig, names: Sequence[str]) -> list[str]:
    """The columns that become params (all but the key unless cfg names them)."""
    if cfg.key_column not in names:
        raise ValueError(f"key column {cfg.key_column!r} is not among the columns {list(names)}")
    if cfg.params_columns is None:
        return [n for n in names if n != cfg.key_column]
    missing = [c for c in cfg.params_columns if c not in names]
    if missing:
        raise ValueError(f"params columns {missing} are not among the columns {list(names)}")
    return list(cfg.params_columns)


def _head(cfg: SparkQueueConfig) -> str:
    """The body's text before the params object (the same for every row of a job)."""
    return f'{{"m":{json.dumps(cfg.method)},"p":'


def body_tail(cfg: SparkQueueConfig) -> str:
    """The body's text after the params object: what is not at its default (StoredRequest),
    the same for every row of a job (ASCII: json.dumps escapes the rest). What comes before it,
    the method and the params, is what a fingerprint hashes (prq.spark._runtime.Enqueuer)."""
    priority = f',"q":{cfg.priority:d}' if cfg.priority else ""
    delivery = f',"d":"{cfg.delivery}"' if cfg.delivery != "at_most_once" else ""
    asked = cfg.asked_response_ttl_s()
    keep = f',"k":{json.dumps(float(asked))}' if asked is not None else ""
    trace = f',"h":{json.dumps(dict(cfg.trace_headers))}' if cfg.trace_headers else ""
    return f',"r":{json.dumps(cfg.producer)}{priority}{delivery}{keep}{trace}}}'


# -- Arrow ---------------------------------------------------------------------------------------


def arrow_chunks(
    cfg: SparkQueueConfig, batches: Iterable[pa.RecordBatch], max_body_bytes: int
) -> Iterator[Chunk]:
    """Chunks of at most `cfg.batch_size` rows from Arrow batches, each batch encoded at once."""
    for batch in batches:
        if batch.num_rows == 0:
            continue
        ids, bodies, ok = _encode_batch(cfg, batch, max_body_bytes)
        for start in range(0, batch.num_rows, cfg.batch_size):
            stop = min(start + cfg.batch_size, batch.num_rows)
            yield _chunk(cfg, batch, ids, bodies, ok, start, stop, max_body_bytes)


def _encode_batch(
    cfg: SparkQueueConfig, batch: pa.RecordBatch, max_body_bytes: int
) -> tuple[pa.Array, pa.Array, pa.Array]:
    """(ids, bodies, ok) for every row; ok is false where the id is invalid or the body too big."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = param_columns(cfg, batch.schema.names)
    ids, valid = _ids(cfg, batch.column(cfg.key_column))
    parts: list[Any] = [_head(cfg) + "{"]
    for i, name in enumerate(names):
        parts += [("," if i else "") + json.dumps(name) + ":", _json_text(batch.column(name))]
    parts.append("}" + body_tail(cfg))
    if not names:  # no params column: every body is the same (and the join needs a column)
        bodies = pa.array(["".join(parts)] * batch.num_rows, pa.string())
    else:
        bodies = pc.binary_join_element_wise(*parts, "")
    fits = pc.less_equal(pc.binary_length(bodies), pa.scalar(max_body_bytes, pa.int64()))
    return ids, bodies, pc.and_(valid, fits)


def _ids(cfg: SparkQueueConfig, keys: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Request ids and whether each is valid (the same rule as `request_id`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = keys.type
    if pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind):
        text = pc.cast(keys, pa.string())
        ids = pc.binary_join_element_wise(f"{cfg.namespace}:", text, "")
        valid = pc.and_(
            pc.greater(pc.binary_length(text), 0), pc.match_substring_regex(ids, REQUEST_ID_PATTERN)
        )
        return ids, pc.fill_null(valid, False)
    found = [request_id(cfg.namespace, key) for key in keys.to_pylist()]
    return pa.array(found, pa.string()), pa.array([rid is not None for rid in found])


def _json_text(column: pa.Array) -> pa.Array:
    """Each value of `column` as JSON text (never null: a null is "null")."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = column.type
    text: pa.Array
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        text = pc.cast(column, pa.string())
    elif pa.types.is_float32(kind) or pa.types.is_float64(kind):
        text = pc.cast(column, pa.string())
        text = pc.if_else(
            pc.match_substring_regex(text, _INTEGRAL), pc.binary_join_element_wise(text, ".0", ""),
            text,
        )  # fmt: skip
        text = pc.if_else(pc.is_finite(column), text, pa.scalar(None, pa.string()))
    elif (pa.types.is_string(kind) or pa.types.is_large_string(kind)) and not pc.any(
        pc.match_substring_regex(column, _NEEDS_ESCAPE)
    ).as_py():
        text = pc.binary_join_element_wise('"', pc.cast(column, pa.string()), '"', "")
    elif pa.types.is_map(kind):  # to_pylist gives lists of pairs, [] for an empty map
        values = column.to_pylist()
        text = pa.array([None if v is None else _dumps(dict(v)) for v in values], pa.string())
    else:
        text = pa.array([_dumps(value) for value in column.to_pylist()], pa.string())
    return pc.fill_null(text, "null")


def _chunk(
    cfg: SparkQueueConfig,
    batch: pa.RecordBatch,
    ids: pa.Array,
    bodies: pa.Array,
    ok: pa.Array,
    start: int,
    stop: int,
    max_body_bytes: int,
) -> Chunk:
    import pyarrow.compute as pc

    count = stop - start
    ok_part = ok.slice(start, count)
    chunk = Chunk()
    if pc.all(ok_part).as_py():
        chunk.ids = ids.slice(start, count).to_pylist()
        chunk.bodies = bodies.slice(start, count).to_pylist()
        return chunk
    keys = batch.column(cfg.key_column).slice(start, count).to_pylist()
    for i, (rid, body, good) in enumerate(
        zip(
            ids.slice(start, count).to_pylist(),
            bodies.slice(start, count).to_pylist(),
            ok_part.to_pylist(),
            strict=True,
        )
    ):
        _place(chunk, cfg, keys[i], rid, body, good)
    return chunk


def _place(
    chunk: Chunk, cfg: SparkQueueConfig, key: Any, rid: str | None, body: str, good: bool
) -> None:
    """Put one row in `chunk`: as a request, an invalid key, or a body over the limit."""
    if good:
        chunk.ids.append(rid or "")
        chunk.bodies.append(body)
    elif rid is None or request_id(cfg.namespace, key) is None:
        chunk.invalid.append(
            (f"{cfg.namespace}:{key}", f"row key {key!r} makes no valid request id")
        )
    else:
        chunk.too_large.append((rid, len(body.encode())))


# -- Rows ----------------------------------------------------------------------------------------


def row_chunks(cfg: SparkQueueConfig, rows: Iterable[Row], max_body_bytes: int) -> Iterator[Chunk]:
    """Chunks of at most `cfg.batch_size` rows from Spark Rows (foreachPartition)."""
    head, tail = _head(cfg), body_tail(cfg)
    chunk = Chunk()
    key_at: int | None = None
    params: list[tuple[str, int]] = []
    for row in rows:
        if key_at is None:
            names = list(row.__fields__)
            params = [(n, names.index(n)) for n in param_columns(cfg, names)]
            key_at = names.index(cfg.key_column)
        key = row[key_at]
        rid = request_id(cfg.namespace, key)
        body = "" if rid is None else f"{head}{_params_json(row, params)}{tail}"
        _place(chunk, cfg, key, rid, body, rid is not None and _fits(body, max_body_bytes))
        if chunk.rows >= cfg.batch_size:
            yield chunk
            chunk = Chunk()
    if chunk.rows:
        yield chunk


_PLAIN = frozenset({str, int, float, bool, type(None)})
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _params_json(row: Row, params: list[tuple[str, int]]) -> str:
    """The params object of one row: one C-encoder call when the values are plain."""
    values = {}
    for name, at in params:
        value = row[at]
        values[name] = value if type(value) in _PLAIN else jsonable(value)
    try:
        return _ENCODER.encode(values)
    except ValueError:  # NaN or an infinity: null, as in the Arrow path
        return _ENCODER.encode(jsonable(values))


def _fits(body: str, limit: int) -> bool:
    # a str is at most 4 bytes per character in UTF-8: count bytes only when it could be over
    return len(body) * 4 <= limit or len(body.encode()) <= limit
