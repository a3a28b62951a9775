"""Large payloads beside Redis: DataStreams and the stores that keep them.

A `DataStream` is a binary payload attached to a request or a response
(`Request(streams={"file": DataStream.from_path(p)})`). It never goes through Redis: when the
message is sent, the node copies the stream, chunk by chunk, into its `DataStreamStore` (a
directory the nodes share, by default), and Redis keeps only the stream's id, length and the
store's reference inside the message, with the message's TTL. The node that receives the
message reads the stream from the store, again chunk by chunk: memory stays bounded by the
chunk size, whatever the stream's length.

Lifecycle: a request's streams are deleted once its answer is accepted, or by its caller when
the request never ran; a response's streams once the caller closed what it read. Whatever is
left (a caller that never read, a node that died) expires: every piece of data is stored with
an expiry, and any node's `cleanup` (run by every node every data-loss check) removes it after
that. A request's data lives as long as the request may still need it (see
prq.protocol.stream_keeper): its expiry covers every attempt, a dead letter's life and a replay, and
a receiver that holds the request `extend`s it as it works. `open()` works once per DataStream
object.

A store is three calls, an extension and a sweep (`DataStreamStore`); `FileSystemStore` is the
default.
References come from Redis, which other parties may write: a store must accept only the
references it makes (FileSystemStore checks them against its own pattern, so no path outside
its directory is ever opened).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from pydantic_core import core_schema

from prq.core.errors import SerializationError

__all__ = [
    "DATASTREAMS_DIR_ENV",
    "DEFAULT_CHUNK_BYTES",
    "DataStream",
    "DataStreamStore",
    "FileSystemStore",
    "store_from_env",
]

#: Environment variable naming the shared directory of `prq worker`'s DataStreams.
DATASTREAMS_DIR_ENV = "PRQ_DATASTREAMS_DIR"

#: Bytes per chunk when a stream is copied.
DEFAULT_CHUNK_BYTES = 1024 * 1024
#: Longest reference accepted on the wire.
MAX_REFERENCE_LENGTH = 512
_STREAM_ID = re.compile(r"^[0-9a-f]{32}$")


class DataStreamStore(Protocol):
    """Where DataStreams are kept while their message is in flight."""

    def store(self, stream_id: str, chunks: Iterable[bytes], expires_at_ms: int) -> str:
        """Copy the chunks in; return the reference the message will carry. The data may be
        removed after `expires_at_ms` (ms since the epoch)."""
        ...

    def rehydrate(self, reference: str) -> BinaryIO:
        """A readable binary stream of the data (SerializationError if there is none)."""
        ...

    def delete(self, reference: str) -> None:
        """Remove the data (nothing happens if it is gone)."""
        ...

    def extend(self, reference: str, expires_at_ms: int) -> None:
        """Keep the data at least until `expires_at_ms`; never shortens its life, and the
        reference stays the same (nothing happens if the data is gone)."""
        ...

    def cleanup(self, now_ms: int) -> int:
        """Remove data past its expiry; how many were removed."""
        ...


class _CountingReader(io.RawIOBase):
    """A read-only stream over the store's one that counts the bytes read, and runs `on_close`
    once when closed."""

    def __init__(self, inner: BinaryIO, on_close: Callable[[], None] | None) -> None:
        super().__init__()
        self._inner = inner
        self._on_close = on_close
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._inner.read(len(buffer))
        buffer[: len(data)] = data
        self.bytes_read += len(data)
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._inner.close()
            on_close, self._on_close = self._on_close, None
            if on_close is not None:
                on_close()
        super().close()


class DataStream:
    """A binary payload that travels beside a message (see the module docstring).

    To send one, build it from bytes, a file or an iterable of chunks. A received one is bound
    to the node's store: `open()` it once (a binary file object), or `read()` / `save()` it.
    """

    __slots__ = ("_bound", "_opened", "_reader", "_source", "id", "length", "reference")

    def __init__(
        self,
        source: Callable[[], Iterable[bytes]] | None = None,
        *,
        length: int | None = None,
        stream_id: str | None = None,
        reference: str | None = None,
    ) -> None:
        self.id = stream_id or uuid.uuid4().hex
        if not _STREAM_ID.match(self.id):
            raise ValueError(f"a DataStream id is 32 lowercase hex digits, not {self.id!r}")
        self.length = length
        self.reference = reference
        self._source = source
        self._bound: tuple[DataStreamStore, Callable[[], None] | None] | None = None
        self._opened = False
        self._reader: _CountingReader | None = None

    # -- building one to send -----------------------------------------------------------------

    @classmethod
    def from_bytes(cls, data: bytes) -> DataStream:
        return cls(lambda: (data[i : i + DEFAULT_CHUNK_BYTES]
                            for i in range(0, len(data), DEFAULT_CHUNK_BYTES)),
                   length=len(data))  # fmt: skip

    @classmethod
    def from_path(cls, path: str | os.PathLike[str]) -> DataStream:
        """The file's content, read chunk by chunk when the message is sent."""
        file = Path(path)

        def chunks() -> Iterator[bytes]:
            with file.open("rb") as handle:
                while chunk := handle.read(DEFAULT_CHUNK_BYTES):
                    yield chunk

        return cls(chunks, length=file.stat().st_size)

    @classmethod
    def from_chunks(cls, chunks: Iterable[bytes], length: int | None = None) -> DataStream:
        """An iterable of chunks (consumed once, when the message is sent)."""
        return cls(lambda: chunks, length=length)

    @property
    def stored(self) -> bool:
        """Whether the data is in a store (the stream can travel)."""
        return self.reference is not None

    def store_in(self, store: DataStreamStore, expires_at_ms: int) -> DataStream:
        """A copy of this stream kept in `store` (the data copied chunk by chunk)."""
        if self._source is None:
            raise ValueError(f"DataStream {self.id} has no data to store")
        counted = 0

        def counting() -> Iterator[bytes]:
            nonlocal counted
            for chunk in self._source() if self._source is not None else ():
                counted += len(chunk)
                yield bytes(chunk)

        reference = store.store(self.id, counting(), expires_at_ms)
        return DataStream(length=counted, stream_id=self.id, reference=reference)

    # -- reading a received one ---------------------------------------------------------------

    def bind(self, store: DataStreamStore, *, delete_after_read: bool) -> None:
        """Let `open()` read this stream from `store` (done by the receiving node)."""
        self._bound = (store, (lambda: store.delete(self.reference or "")) if delete_after_read
                       else None)  # fmt: skip

    def open(self) -> BinaryIO:
        """The data, as a binary file object read from the store (once per DataStream)."""
        if self._bound is None or self.reference is None:
            raise SerializationError(
                f"DataStream {self.id} is not bound to a store: only a received stream can be "
                "read, by a node given a DataStreamStore"
            )
        if self._opened:
            raise SerializationError(f"DataStream {self.id} was opened already (read once)")
        self._opened = True
        store, on_close = self._bound
        self._reader = _CountingReader(store.rehydrate(self.reference), on_close)
        return io.BufferedReader(self._reader, DEFAULT_CHUNK_BYTES)

    @property
    def bytes_read(self) -> int:
        """Bytes read from the store so far through `open()` (on the receiving side)."""
        return 0 if self._reader is None else self._reader.bytes_read

    def read(self) -> bytes:
        """All the data at once (for small streams: it is held in memory)."""
        with self.open() as stream:
            return stream.read()

    def save(self, path: str | os.PathLike[str]) -> int:
        """Copy the data to `path`, chunk by chunk; the bytes written."""
        written = 0
        with self.open() as stream, Path(path).open("wb") as out:
            while chunk := stream.read(DEFAULT_CHUNK_BYTES):
                out.write(chunk)
                written += len(chunk)
        return written

    # -- on the wire ----------------------------------------------------------------------------

    def wire(self) -> dict[str, Any]:
        if self.reference is None:
            raise ValueError(
                f"DataStream {self.id} is not stored yet: send its message through a queue "
                "given a DataStreamStore"
            )
        return {"id": self.id, "length": self.length, "ref": self.reference}

    @classmethod
    def from_wire(cls, value: object) -> DataStream:
        if isinstance(value, DataStream):
            return value
        if not isinstance(value, dict) or set(value) != {"id", "length", "ref"}:
            raise ValueError("a DataStream on the wire is {id, length, ref}")
        stream_id, length, ref = value["id"], value["length"], value["ref"]
        if not isinstance(stream_id, str) or not _STREAM_ID.match(stream_id):
            raise ValueError("a DataStream id is 32 lowercase hex digits")
        if not isinstance(length, int) or isinstance(length, bool) or length < 0:
            raise ValueError("a DataStream length is a non-negative integer")
        if not isinstance(ref, str) or not 1 <= len(ref) <= MAX_REFERENCE_LENGTH:
            raise ValueError(f"a DataStream reference is 1-{MAX_REFERENCE_LENGTH} characters")
        return cls(length=length, stream_id=stream_id, reference=ref)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls.from_wire,
            serialization=core_schema.plain_serializer_function_ser_schema(lambda s: s.wire()),
        )

    def __repr__(self) -> str:
        where = f"ref={self.reference!r}" if self.reference else "unstored"
        return f"DataStream(id={self.id}, length={self.length}, {where})"


class FileSystemStore:
    """DataStreams as files in one directory that every node mounts (NFS, a shared volume).

    Files are named `<expiry ms>-<stream id>`: the reference is that name, checked against the
    pattern before any path is built, and `cleanup` needs no index. `extend` sets a file's
    modification time to its new expiry (its name, which is its reference, cannot change), and
    `cleanup` removes a file only once both have passed. A file is written under a temporary
    name and renamed when complete, so a reader never sees half of one.
    """

    _NAME = re.compile(r"^(\d{1,15})-([0-9a-f]{32})$")
    #: A temporary file older than this is a writer that died (cleanup removes it), seconds.
    STALE_PART_S = 24 * 3600

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def _path(self, reference: str) -> Path:
        if not self._NAME.match(reference):
            raise SerializationError(
                f"{reference[:80]!r} is not a reference of this store (a forged or foreign "
                "stream reference)"
            )
        return self.directory / reference

    def store(self, stream_id: str, chunks: Iterable[bytes], expires_at_ms: int) -> str:
        reference = f"{expires_at_ms}-{stream_id}"
        final = self._path(reference)
        part = self.directory / f".{reference}.{uuid.uuid4().hex[:8]}.part"
        try:
            with part.open("wb") as out:
                for chunk in chunks:
                    out.write(chunk)
            os.replace(part, final)
        finally:
            part.unlink(missing_ok=True)
        return reference

    def rehydrate(self, reference: str) -> BinaryIO:
        try:
            return self._path(reference).open("rb")
        except FileNotFoundError as exc:
            raise SerializationError(
                f"stream {reference!r} is not in {self.directory} (deleted, expired, or this "
                "node does not share the senders' directory)"
            ) from exc

    def delete(self, reference: str) -> None:
        self._path(reference).unlink(missing_ok=True)

    def extend(self, reference: str, expires_at_ms: int) -> None:
        path = self._path(reference)
        until_ns = expires_at_ms * 1_000_000
        with contextlib.suppress(FileNotFoundError):  # (deleted meanwhile: nothing to keep)
            status = path.stat()
            if status.st_mtime_ns < until_ns:
                os.utime(path, ns=(status.st_atime_ns, until_ns))

    def cleanup(self, now_ms: int | None = None) -> int:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        removed = 0
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if self._due(entry, now):
                    Path(entry.path).unlink(missing_ok=True)
                    removed += 1
        return removed

    def _due(self, entry: os.DirEntry[str], now_ms: int) -> bool:
        """Whether cleanup removes this file: expired (by its name, and by its modification
        time, which `extend` moves), or a writer's leftover."""
        found = self._NAME.match(entry.name)
        if found is None and not entry.name.endswith(".part"):
            return False
        if found is not None and int(found.group(1)) >= now_ms:
            return False
        try:
            modified_ms = entry.stat().st_mtime * 1000
        except FileNotFoundError:  # renamed or removed by its writer meanwhile
            return False
        if found is not None:
            return modified_ms < now_ms  # (extended: the modification time is the expiry)
        return modified_ms < now_ms - self.STALE_PART_S * 1000


def store_from_env() -> FileSystemStore | None:
    """A FileSystemStore on `PRQ_DATASTREAMS_DIR`, or None when it is not set."""
    directory = os.environ.get(DATASTREAMS_DIR_ENV)
    return FileSystemStore(directory) if directory else None
