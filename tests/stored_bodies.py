"""Read and write a request record as prq stores it (prq.core.records: a hash with the body in
pieces when small, or, for a request BulkClient queued and nobody picked up yet, one string in the
queued form), for tests that look at, damage or replace what Redis holds."""

from __future__ import annotations

import redis

from prq.core.records import body_fields, first_fields, join_body, queued_fields, rest_fields


def record_fields(client: redis.Redis, key: str) -> dict[bytes, bytes]:
    """The record's fields as HGETALL answers them, whichever form it is in (empty: no record;
    a string record's body is whole, in `b`)."""
    if client.type(key) != b"string":
        return client.hgetall(key)  # type: ignore[return-value]
    raw: bytes = client.get(key)  # type: ignore[assignment]
    fields = queued_fields(raw)
    assert fields is not None, f"{key} holds a string that is not a queued record: {raw!r:.100}"
    if "ix" in fields:  # its deadline, sequence number and nonce are in its batch's head
        head = key.split("}:r:", 1)[0] + "}:bh:" + fields["bh"].decode()
        shared = client.get(head)
        if isinstance(shared, bytes):
            deadline, first, fields["bn"] = shared.split(b",", 2)
            fields["pd"] = deadline
            fields["sq"] = b"%d" % (int(first) + int(fields.pop("ix")) - 1)
    return {name.encode(): value for name, value in fields.items()}


def record_field(client: redis.Redis, key: str, name: str) -> bytes | None:
    """One field of the record, whichever form it is in."""
    return record_fields(client, key).get(name.encode())


def read_body(client: redis.Redis, key: str) -> bytes | None:
    """The body the record at `key` holds (None: none, or a piece is missing)."""
    if client.type(key) == b"string":
        return record_field(client, key, "b")
    first, count = client.hmget(key, first_fields())
    names = rest_fields(count)
    rest = client.hmget(key, names) if names else []
    return join_body(first, rest)  # type: ignore[arg-type]


def write_body(client: redis.Redis, key: str, body: bytes) -> None:
    """Replace the record's body with `body` (in pieces if prq would store it so; a string
    record keeps its form, with the body replaced)."""
    if client.type(key) == b"string":
        raw: bytes = client.get(key)  # type: ignore[assignment]
        fields = queued_fields(raw)
        assert fields is not None, f"{key} holds a string that is not a queued record"
        head = raw[: len(raw) - len(fields["b"])]  # the body runs to the end
        client.set(key, head + body, keepttl=True)
        return
    _, count = client.hmget(key, first_fields())
    pipe = client.pipeline(transaction=True)
    pipe.hdel(key, *first_fields(), *rest_fields(count))
    pipe.hset(key, mapping=body_fields(body))  # type: ignore[arg-type]
    pipe.execute()


def body_field_names(fields: set[bytes]) -> set[bytes]:
    """The fields of a record's field set that hold its body."""
    return {f for f in fields if f in (b"b", b"bk") or (f[:1] == b"b" and f[1:].isdigit())}
