"""An incremental RESP2/RESP3 frame splitter for the fault proxy's server→client direction.

`RespFrames.feed(chunk)` takes bytes as they arrive (frames may be split anywhere across reads)
and returns the top-level frames that are now complete, as byte strings, in order; the bytes of
an unfinished frame stay inside until the rest arrives. The state is resumable (a stack of
remaining element counts plus the bytes left of a bulk payload), so a frame that arrives in many
reads is scanned once, and a large bulk payload is skipped without being scanned at all.

`is_pubsub_message(frame, resp2_subscriber=...)` says whether a complete frame is a pub/sub
*message*: a RESP3 push `>3 message` / `>3 smessage` / `>4 pmessage`, or (only on a connection
that subscribed, where it cannot be a command reply) the RESP2 array of the same shape.
Subscribe confirmations, pongs and every reply are not messages.

Anything that is not RESP (a replication stream's raw RDB payload, a streamed `$?` string)
raises `RespError`; the proxy then forwards that connection's bytes raw from then on.
"""

from __future__ import annotations

import re

__all__ = ["RespError", "RespFrames", "is_pubsub_message"]

#: Bulk-like types: a length line, then that many bytes and CRLF (`-1` means null).
_BULK = frozenset(b"$!=")
#: Aggregates of n elements (`-1` means null).
_AGGREGATE = frozenset(b"*~>")
#: Aggregates of n key/value pairs (2n elements).
_MAP = frozenset(b"%|")
#: Single-line types.
_SIMPLE = frozenset(b"+-:_,#(")
#: Longest header line accepted before declaring the stream not RESP.
_MAX_LINE = 64 * 1024

_MESSAGE_RE = re.compile(rb"^([>*])([34])\r\n\$(\d+)\r\n(message|smessage|pmessage)\r\n")


class RespError(ValueError):
    """The byte stream is not RESP."""


class RespFrames:
    """Splits a RESP byte stream into complete top-level frames (see the module docstring)."""

    __slots__ = ("_buf", "_bulk_left", "_pos", "_stack")

    def __init__(self) -> None:
        self._buf = bytearray()
        #: Scan position in `_buf` (everything before it belongs to the current frame).
        self._pos = 0
        #: Bytes still to skip of the current bulk payload, including its CRLF.
        self._bulk_left = 0
        #: Per open aggregate: [elements left, whether it counts as an element of its parent].
        self._stack: list[list[int]] = []

    @property
    def pending_bytes(self) -> int:
        """Bytes held back because their frame is not complete yet."""
        return len(self._buf)

    def take_pending(self) -> bytes:
        """Give up parsing: hand back the held bytes (the caller forwards raw from now on)."""
        held = bytes(self._buf)
        self._buf.clear()
        self._pos = self._bulk_left = 0
        self._stack.clear()
        return held

    def feed(self, data: bytes) -> list[bytes]:
        """Add `data`; return the frames it completed (raises RespError on a non-RESP stream)."""
        buf = self._buf
        buf += data
        frames: list[bytes] = []
        start = 0
        while True:
            if self._bulk_left:
                available = len(buf) - self._pos
                if available < self._bulk_left:
                    self._pos += available
                    self._bulk_left -= available
                    break
                self._pos += self._bulk_left
                self._bulk_left = 0
                if buf[self._pos - 2 : self._pos] != b"\r\n":
                    raise RespError("bulk payload not followed by CRLF")
                if self._element_done():
                    frames.append(bytes(buf[start : self._pos]))
                    start = self._pos
                continue
            eol = buf.find(b"\r\n", self._pos)
            if eol < 0:
                if len(buf) - self._pos > _MAX_LINE:
                    raise RespError("header line too long")
                break
            if self._header(buf[self._pos], bytes(buf[self._pos + 1 : eol])):
                self._pos = eol + 2
                frames.append(bytes(buf[start : self._pos]))
                start = self._pos
            else:
                self._pos = eol + 2
        if start:
            del buf[:start]
            self._pos -= start
        return frames

    def _header(self, kind: int, arg: bytes) -> bool:
        """Consume one header line; True if it completed a top-level frame."""
        if kind in _SIMPLE:
            return self._element_done()
        try:
            count = int(arg)
        except ValueError:
            raise RespError(f"bad length {arg[:20]!r} for type {chr(kind)!r}") from None
        if kind in _BULK:
            if count < 0:
                return self._element_done()
            self._bulk_left = count + 2
            return False
        if kind in _AGGREGATE or kind in _MAP:
            elements = count * 2 if kind in _MAP else count
            counts_as_element = kind != ord("|")  # an attribute only decorates the next element
            if elements <= 0:
                return self._element_done() if counts_as_element else False
            self._stack.append([elements, int(counts_as_element)])
            return False
        raise RespError(f"unknown RESP type byte {kind!r}")

    def _element_done(self) -> bool:
        """One element finished; close the aggregates it completes. True at a frame's end."""
        stack = self._stack
        while stack:
            top = stack[-1]
            top[0] -= 1
            if top[0] > 0:
                return False
            stack.pop()
            if not top[1]:
                return False  # an attribute ended; the element it decorates follows
        return True


def is_pubsub_message(frame: bytes, *, resp2_subscriber: bool) -> bool:
    """True if `frame` (one complete top-level frame) is a pub/sub message (module docstring)."""
    match = _MESSAGE_RE.match(frame)
    if match is None:
        return False
    kind, count, length, name = match.groups()
    if int(length) != len(name):
        return False
    if (name == b"pmessage") != (count == b"4"):
        return False
    return kind == b">" or resp2_subscriber
