"""Bodies kept beside Redis: the marker that stands in Redis for a body over inline_limit_bytes.

A request or response whose JSON is longer than `QueueSettings.inline_limit_bytes` is written
to the node's DataStreamStore (prq.protocol.stream_keeper does the I/O), and Redis keeps this
instead:

    #prq-body1 {"ref": "<store reference>", "len": <bytes>, "sha256": "<hex>"}\\n<stub JSON>

The stub is the message with its payload left out (a request without `params` and `headers`, a
response with only its id), so that admin views still show what the request is. The reader
checks the body it reads back against `len` and `sha256`: with signing on, the signature covers
this marker, and so the body too. Pure: no I/O here.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from prq.core.errors import SerializationError

__all__ = ["MARKER", "SpilledBody", "is_spilled", "marker", "parse", "stub"]

MARKER = b"#prq-body1 "
#: Longest marker line accepted (the reference is at most 512 characters).
_MAX_HEADER = 1024


@dataclass(frozen=True, slots=True)
class SpilledBody:
    """What a marker says: where the body is, how long it is, and its SHA-256."""

    reference: str
    length: int
    sha256: str

    def check(self, body: bytes) -> bytes:
        """`body` if it is the one the marker names, else SerializationError."""
        if len(body) != self.length:
            raise SerializationError(
                f"body {self.reference!r} is {len(body)} bytes, the marker says {self.length}"
            )
        if hashlib.sha256(body).hexdigest() != self.sha256:
            raise SerializationError(
                f"body {self.reference!r} does not match its marker's SHA-256 (changed in the "
                "store)"
            )
        return body


def is_spilled(data: bytes) -> bool:
    """Whether `data` (a stored body, outside any signature envelope) is a marker."""
    return data.startswith(MARKER)


def marker(reference: str, body: bytes, stub_json: bytes) -> bytes:
    """The marker that stands in Redis for `body`, stored under `reference`."""
    header = json.dumps(
        {"ref": reference, "len": len(body), "sha256": hashlib.sha256(body).hexdigest()},
        separators=(",", ":"),
    ).encode()
    return MARKER + header + b"\n" + stub_json


def _split(data: bytes) -> tuple[bytes, bytes]:
    end = data.find(b"\n", 0, _MAX_HEADER)
    if end < 0:
        raise SerializationError("body marker has no end of line (truncated or forged)")
    return data[len(MARKER) : end], data[end + 1 :]


def parse(data: bytes) -> SpilledBody:
    """The marker's fields; SerializationError when it is malformed."""
    header, _ = _split(data)
    try:
        fields = json.loads(header)
        reference, length, digest = fields["ref"], fields["len"], fields["sha256"]
    except (ValueError, TypeError, KeyError) as exc:
        raise SerializationError(f"body marker is malformed: {exc}") from exc
    valid = (
        isinstance(reference, str)
        and 0 < len(reference) <= 512
        and isinstance(length, int)
        and not isinstance(length, bool)
        and length >= 0
        and isinstance(digest, str)
        and len(digest) == 64
    )
    if not valid:
        raise SerializationError(f"body marker is malformed: {header[:200]!r}")
    return SpilledBody(reference, length, digest)


def stub(data: bytes) -> bytes:
    """The stub JSON of a marker (for display); `data` itself when it is not one."""
    if not is_spilled(data):
        return data
    try:
        return _split(data)[1]
    except SerializationError:
        return data
