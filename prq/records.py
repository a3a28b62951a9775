"""How a request's body is kept in its record, for the Python readers (scripts/_body.lua writes it).

A body of more than BODY_PIECE_BYTES and at most CHUNKED_MAX_BYTES is cut into pieces of
BODY_PIECE_BYTES (the last one shorter): field `b` holds the first, `b1`, `b2`, ... the next
ones, and `bk` their number. Any other body is in `b` alone, without `bk`. Pieces keep every
value of a small record within Redis's hash-max-listpack-value (64 bytes by default), so the
record stays in one compact listpack block instead of a table of separately allocated fields.
Pure: no I/O here; readers ask for `first_fields()`, then `rest_fields()` when `bk` says so.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "BODY_PIECE_BYTES",
    "CHUNKED_MAX_BYTES",
    "MAX_PIECES",
    "body_fields",
    "body_size_bound",
    "first_fields",
    "join_body",
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
    """The body from its pieces; None when the first or any piece is missing."""
    if first is None or any(part is None for part in rest):
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
