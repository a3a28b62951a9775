"""Read and write a request record's body as prq stores it (prq.records: in pieces when small),
for tests that look at, damage or replace what Redis holds."""

from __future__ import annotations

import redis

from prq.records import body_fields, first_fields, join_body, rest_fields


def read_body(client: redis.Redis, key: str) -> bytes | None:
    """The body the record at `key` holds (None: none, or a piece is missing)."""
    first, count = client.hmget(key, first_fields())
    names = rest_fields(count)
    rest = client.hmget(key, names) if names else []
    return join_body(first, rest)  # type: ignore[arg-type]


def write_body(client: redis.Redis, key: str, body: bytes) -> None:
    """Replace the record's body with `body` (in pieces if prq would store it so)."""
    _, count = client.hmget(key, first_fields())
    pipe = client.pipeline(transaction=True)
    pipe.hdel(key, *first_fields(), *rest_fields(count))
    pipe.hset(key, mapping=body_fields(body))  # type: ignore[arg-type]
    pipe.execute()


def body_field_names(fields: set[bytes]) -> set[bytes]:
    """The fields of a record's field set that hold its body."""
    return {f for f in fields if f in (b"b", b"bk") or (f[:1] == b"b" and f[1:].isdigit())}
