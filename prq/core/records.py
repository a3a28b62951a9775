"""How a request's body is kept in its record, for the Python readers (scripts/_body.lua writes it).

A body of more than BODY_PIECE_BYTES and at most CHUNKED_MAX_BYTES is cut into pieces of
BODY_PIECE_BYTES (the last one shorter): field `b` holds the first, `b1`, `b2`, ... the next
ones, and `bk` their number. Any other body is in `b` alone, without `bk`. Pieces keep every
value of a small record within Redis's hash-max-listpack-value (64 bytes by default), so the
record stays in one compact listpack block instead of a table of separately allocated fields.
Pure: no I/O here; readers ask for `first_fields()`, then `rest_fields()` when `bk` says so.

A request queued by `BulkClient` is kept in the *queued form* until something changes it: one
string rather than a hash (scripts/_body.lua has the layout: `Q1` or `Q2`, creation time, and
either pickup deadline and sequence number or the place in its batch, then named fields, the
body last). A reader asks Redis for the key's TYPE,
then reads a hash with HMGET and a string with MGET (which answers nil, not an error, should a
script have turned it into a hash meanwhile), and gets the same fields from `queued_values`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = [
    "BODY_PIECE_BYTES",
    "CHUNKED_MAX_BYTES",
    "MAX_PIECES",
    "QUEUED_HEAD_BYTES",
    "QUEUED_TAG",
    "body_fields",
    "body_size_bound",
    "first_fields",
    "join_body",
    "queued_body_size",
    "queued_fields",
    "queued_head",
    "queued_values",
    "rest_fields",
]

#: The size of every piece but the last (scripts/_body.lua: CHUNK).
BODY_PIECE_BYTES = 64
#: Longest body cut into pieces (scripts/_body.lua: CHUNKED_MAX).
CHUNKED_MAX_BYTES = 4096
#: Most pieces a record holds.
MAX_PIECES = CHUNKED_MAX_BYTES // BODY_PIECE_BYTES


def first_fields() -> list[str]:
    """The fields to read first: the body's first piece and the piece count."""
    return ["b", "bk"]


def pieces(count: bytes | str | int | None) -> int:
    """The piece count a record's `bk` says (1 when absent or not one prq writes)."""
    try:
        n = int(count) if count is not None else 1
    except ValueError:
        return 1
    return n if 1 <= n <= MAX_PIECES else 1


def rest_fields(count: bytes | str | int | None) -> list[str]:
    """The fields holding the pieces after the first (none for a body in `b` alone)."""
    return [f"b{i}" for i in range(1, pieces(count))]


def join_body(first: bytes | None, rest: Sequence[bytes | None]) -> bytes | None:
    """The body from its pieces; None when the first or any piece is missing, or empty (an
    answered request's body fields are kept empty: scripts/_body.lua blank_body)."""
    if not first or any(part is None for part in rest):
        return None
    return first + b"".join(part for part in rest if part is not None)


def body_size_bound(first_size: int, count: bytes | str | int | None) -> int:
    """An upper bound of a body's size from its first piece's size and its piece count: exact
    for a body in `b` alone, at most BODY_PIECE_BYTES - 1 over for one in pieces."""
    n = pieces(count)
    return first_size if n == 1 else n * BODY_PIECE_BYTES


def body_fields(body: bytes) -> dict[str, bytes]:
    """The fields that store `body`, as scripts/_body.lua writes them (tests write records)."""
    if len(body) <= BODY_PIECE_BYTES or len(body) > CHUNKED_MAX_BYTES:
        return {"b": body}
    parts = [body[i : i + BODY_PIECE_BYTES] for i in range(0, len(body), BODY_PIECE_BYTES)]
    fields = {"b": parts[0]} | {f"b{i}": part for i, part in enumerate(parts[1:], 1)}
    fields["bk"] = str(len(parts)).encode()
    return fields


#: How a record in the queued form starts (scripts/_body.lua: QUEUED_TAG).
QUEUED_TAG = b"Q1"
#: Most named fields a queued-form record holds (scripts/_body.lua: QUEUED_MAX_FIELDS).
QUEUED_MAX_FIELDS = 16
#: A queued-form record's first bytes hold its fields before the body (its creation time
#: first): reading this many of them (GETRANGE) gets those, without the body, unless its named
#: fields are unusually long.
QUEUED_HEAD_BYTES = 256
#: Its two shapes: Q1 ct,pd,sq, (inline) and Q2 ct,ix, (its deadline and sequence number in
#: its batch's shared head, which only the scripts read).
_QUEUED_HEAD = re.compile(rb"Q1(\d+),(\d+),(\d+),|Q2(\d+),(\d+),")
_QUEUED_FIELD = re.compile(rb"([a-z]+)(\d*):")


def _parse_queued(raw: bytes) -> tuple[dict[str, bytes], int] | None:
    """The fields of a queued-form record before its body, and where its body starts; None
    when `raw` is not in that form (or is cut short before its body starts)."""
    head = _QUEUED_HEAD.match(raw)
    if head is None:
        return None
    fields = _fixed(head)
    at = head.end()
    for _ in range(QUEUED_MAX_FIELDS):
        named = _QUEUED_FIELD.match(raw, at)
        if named is None:
            return None
        name, digits, at = named[1].decode(), named[2], named.end()
        if not digits:
            return (fields, at) if name == "b" else None
        stop = at + int(digits)
        if stop > len(raw):
            return None
        fields[name] = raw[at:stop]
        at = stop
    return None


def queued_fields(raw: bytes) -> dict[str, bytes] | None:
    """The fields of a record in the queued form, by name (`st` is `queued`, the body whole in
    `b`); None when `raw` is not in that form."""
    parsed = _parse_queued(raw)
    if parsed is None:
        return None
    fields, at = parsed
    return fields | {"b": raw[at:]}


def queued_body_size(head: bytes, length: int) -> int:
    """The size of the body of a queued-form record of `length` bytes, from its first bytes
    (`head`); `length` itself (an upper bound) when they do not reach the body."""
    parsed = _parse_queued(head)
    return length if parsed is None else length - parsed[1]


def queued_head(head: bytes) -> dict[str, bytes] | None:
    """The fixed fields (`st`, `ct`, and `pd` and `sq` when inline, else `ix`) of a record in
    the queued form from its first bytes (QUEUED_HEAD_BYTES of them, or all); None when they
    are not in that form."""
    fixed = _QUEUED_HEAD.match(head)
    return None if fixed is None else _fixed(fixed)


def _fixed(head: re.Match[bytes]) -> dict[str, bytes]:
    """The fields a queued-form record's fixed start says."""
    if head[1] is None:  # Q2: its deadline and sequence number are in its batch's shared head
        return {"st": b"queued", "ct": head[4], "ix": head[5]}
    return {"st": b"queued", "ct": head[1], "pd": head[2], "sq": head[3]}


def queued_values(raw: bytes, names: Sequence[str]) -> list[bytes | None]:
    """What HMGET of `names` would answer for a record kept as the string `raw`: a string not
    in the queued form reads as a queued record whose body is that string (as the scripts read
    it: whoever decodes the body finds it bad)."""
    fields = queued_fields(raw) or {"st": b"queued", "b": raw}
    return [fields.get(name) for name in names]
