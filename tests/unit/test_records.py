"""prq.core.records: the Python reading of a record's two forms, as scripts/_body.lua writes
them."""

from __future__ import annotations

import pytest

from prq.core.records import (
    BODY_PIECE_BYTES,
    CHUNKED_MAX_BYTES,
    body_fields,
    join_body,
    queued_fields,
    queued_head,
    queued_values,
    rest_fields,
)


def test_the_queued_form_reads_its_fixed_and_named_fields_and_the_body_last() -> None:
    raw = b'Q11764000000000,1764000060000,7,bn11:kQ3xv9Zr_0apro5:a:b|cb:{"m":"x","p":"b:1"}'
    assert queued_fields(raw) == {
        "st": b"queued", "ct": b"1764000000000", "pd": b"1764000060000", "sq": b"7",
        "bn": b"kQ3xv9Zr_0a", "pro": b"a:b|c", "b": b'{"m":"x","p":"b:1"}',
    }  # fmt: skip
    # a value may hold any bytes: its length says where it ends
    assert queued_fields(b"Q11,2,3,bn3:b:xb:\x00\xff") == {
        "st": b"queued", "ct": b"1", "pd": b"2", "sq": b"3", "bn": b"b:x", "b": b"\x00\xff",
    }  # fmt: skip
    assert queued_values(raw, ["st", "sq", "pri", "b"]) == [
        b"queued", b"7", None, b'{"m":"x","p":"b:1"}',
    ]  # fmt: skip


def test_the_q2_shape_reads_its_place_in_the_batch_instead_of_deadline_and_number() -> None:
    # (its deadline and sequence number are in its batch's shared head, read by the scripts)
    raw = b'Q21764000000000,12,bn11:kQ3xv9Zr_0apri2:-1b:{"m":"x"}'
    assert queued_fields(raw) == {
        "st": b"queued", "ct": b"1764000000000", "ix": b"12", "bn": b"kQ3xv9Zr_0a",
        "pri": b"-1", "b": b'{"m":"x"}',
    }  # fmt: skip
    assert queued_head(raw[:20]) == {"st": b"queued", "ct": b"1764000000000", "ix": b"12"}


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"garbage",
        b"Q1",
        b"Q1x,2,3,b:",  # a time that is not a number
        b"Q11,2,3",  # no fields, no body
        b"Q11,2,3,bn99:short",  # a length past the end
        b"Q11,2,3,BN1:xb:",  # a name that is not lowercase letters
        b"Q11,2,3," + b"aa1:x" * 17 + b"b:",  # more named fields than a record holds
        b"Q3" + b"1,2,3,b:",  # another form
        b"Q21,2,3,b:",  # the Q2 shape has two numbers, not three
        b"Q21,b:",  # ...and not one
    ],
)
def test_bytes_not_in_the_queued_form_are_not_read_as_one(raw: bytes) -> None:
    assert queued_fields(raw) is None
    # ...and read as a queued record whose body is those bytes (its decoder finds it bad)
    assert queued_values(raw, ["st", "b", "ct"]) == [b"queued", raw, None]


@pytest.mark.parametrize("size", [0, 1, 64, 65, 128, 129, CHUNKED_MAX_BYTES, CHUNKED_MAX_BYTES + 1])
def test_pieces_join_back_into_the_body(size: int) -> None:
    body = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    fields = body_fields(body)
    rest = [fields[name] for name in rest_fields(fields.get("bk"))]
    # (an empty body reads as none: prq never stores one, and an answer empties the fields)
    assert join_body(fields["b"], rest) == (body or None)
    if BODY_PIECE_BYTES < size <= CHUNKED_MAX_BYTES:
        assert all(len(piece) <= BODY_PIECE_BYTES for piece in fields.values())
