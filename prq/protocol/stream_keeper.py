"""What a node does with the DataStreams of the messages it sends and receives (prq.datastreams).

- Sending: unstored streams are copied into the store before the message is encoded (blocking
  I/O: the asyncio queue runs it in a thread), each with an expiry; a response's lasts as long
  as the response is kept.
- Receiving: the streams of a taken request and of a returned response are bound to the store,
  so the handler or the caller can `open()` them. A response's streams are deleted once the
  caller closes what it read; a request's once the node's answer to it was accepted.
- Bodies over `inline_limit_bytes` (prq.core.bodies): the sender writes the JSON to the store and
  sends a marker instead; the reader reads it back and checks it against the marker. A
  request's body lives until the request is answered (or its caller withdrew it); a
  response's as long as the response is kept (response_ttl_s), since a retry with the same id
  reads it again.
- A request's data lives as long as the request may need it. A request lives on while its
  holder beats, for as long as that takes, so no expiry given when it is stored can be enough
  by itself. The data is stored to outlast everything that happens to the request while nobody
  holds it (`QueueSettings.request_data_ttl_s`: every attempt's wait in the queue and silence
  before it is handed out again, a dead letter's TTL, a replay's wait), and the receiver that
  holds it extends it, at every sweep, to that much beyond now. So a long handler still finds
  its streams, and a redelivery or a replay its body. The price: the data of a request that
  ended without an answer (cancelled, lost with its receiver) stays until that expiry (about
  the dead-letter TTL) instead of being swept sooner.
- Sweeping: every data-loss check interval, the data of held requests is extended, then data
  past its expiry is removed.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from prq.core import bodies
from prq.core.errors import ConfigurationError, PrqError, SerializationError
from prq.core.models import Response, encode_stored_request
from prq.datastreams import DEFAULT_CHUNK_BYTES

if TYPE_CHECKING:
    from prq.core.config import QueueSettings
    from prq.core.models import Request
    from prq.datastreams import DataStream, DataStreamStore

logger = logging.getLogger(__name__)

__all__ = ["StreamKeeper"]


def _now_ms() -> int:
    return int(time.time() * 1000)


class StreamKeeper:
    """A node's DataStream chores (see the module docstring); `store` None means no store."""

    def __init__(
        self,
        store: DataStreamStore | None,
        settings: QueueSettings,
        held: Callable[[], list[str]] = list,
    ) -> None:
        self.store = store
        self.settings = settings
        #: The store references of the data of the requests this node holds (extended).
        self.held = held
        self._next_sweep = 0.0

    @staticmethod
    def unstored(message: Request | Response) -> bool:
        """Whether the message has streams that must be stored before it is sent."""
        return any(not stream.stored for stream in message.streams.values())

    def _stored(
        self, streams: dict[str, DataStream], expires_at_ms: int, what: str
    ) -> dict[str, DataStream]:
        if self.store is None:
            raise ConfigurationError(
                f"{what} carries DataStreams, but this queue has no DataStreamStore: pass "
                "datastreams=FileSystemStore(<a directory every node shares>)"
            )
        store = self.store
        return {
            name: stream if stream.stored else stream.store_in(store, expires_at_ms)
            for name, stream in streams.items()
        }

    def store_request(self, request: Request, pickup_timeout_s: float) -> Request:
        """`request` with its streams in the store (blocking)."""
        if not self.unstored(request):
            return request
        expires = self._request_data_expiry(request, pickup_timeout_s)
        streams = self._stored(request.streams, expires, f"request {request.id}")
        return request.model_copy(update={"streams": streams})

    def store_response(self, response: Response, ttl_s: float) -> Response:
        """`response` with its streams in the store (blocking), kept as long as the response
        (`ttl_s`)."""
        if not self.unstored(response):
            return response
        expires = _now_ms() + int(ttl_s * 1000)
        streams = self._stored(response.streams, expires, f"the response to {response.id}")
        return response.model_copy(update={"streams": streams})

    def bind(self, streams: dict[str, DataStream], *, delete_after_read: bool) -> None:
        """Let the streams be opened from the store (no-op without one: open() says so)."""
        if self.store is not None:
            for stream in streams.values():
                stream.bind(self.store, delete_after_read=delete_after_read)

    def delete(self, streams: dict[str, DataStream]) -> None:
        """Remove the streams' data (a request this node answered)."""
        if self.store is None:
            return
        for stream in streams.values():
            if stream.reference is None:
                continue
            try:
                self.store.delete(stream.reference)
            except Exception as exc:  # the sweep removes it after its expiry
                logger.warning("could not delete stream ref=%r error=%s", stream.reference, exc)

    # -- bodies over inline_limit_bytes -------------------------------------------------------

    def spills(self, body: bytes) -> bool:
        """Whether `body` goes beside Redis: it is over inline_limit_bytes and there is a store
        (without one, bodies stay inline up to max_body_bytes)."""
        return self.store is not None and len(body) > self.settings.inline_limit_bytes

    def spill_request(self, request: Request, body: bytes, pickup_timeout_s: float) -> bytes:
        """Write a request's JSON to the store (blocking); the marker Redis keeps instead."""
        expires = self._request_data_expiry(request, pickup_timeout_s)
        stub = request.model_copy(update={"params": None, "headers": {}})
        return self._spill(body, encode_stored_request(stub), expires)

    def spill_response(self, response: Response, body: bytes, ttl_s: float) -> bytes:
        """Write a response's JSON to the store (blocking); the marker Redis keeps instead,
        which expires with the response (`ttl_s`)."""
        expires = _now_ms() + int(ttl_s * 1000)
        stub = Response(id=response.id).model_dump_json().encode()
        return self._spill(body, stub, expires)

    def _request_data_expiry(self, request: Request, pickup_timeout_s: float) -> int:
        attempts = self.settings.max_attempts if request.delivery == "at_least_once" else 1
        return _now_ms() + int(self.settings.request_data_ttl_s(pickup_timeout_s, attempts) * 1000)

    def _spill(self, body: bytes, stub: bytes, expires_at_ms: int) -> bytes:
        assert self.store is not None  # spills() said so
        step = DEFAULT_CHUNK_BYTES
        chunks = (body[at : at + step] for at in range(0, len(body), step))
        reference = self.store.store(uuid.uuid4().hex, chunks, expires_at_ms)
        return bodies.marker(reference, body, stub)

    def load_body(self, data: bytes, what: str) -> bytes:
        """The body a marker names, read back from the store and checked against the marker
        (blocking). SerializationError when it is missing, too long or changed;
        ConfigurationError when this node has no store."""
        spilled = bodies.parse(data)
        if self.store is None:
            raise ConfigurationError(
                f"{what} is kept beside Redis ({spilled.length} bytes, over the sender's "
                "inline_limit_bytes), but this node has no DataStreamStore: pass "
                "datastreams=FileSystemStore(<the directory the senders use>)"
            )
        if spilled.length > self.settings.max_body_bytes:
            raise SerializationError(
                f"{what}: its marker claims {spilled.length} bytes, over max_body_bytes"
            )
        try:
            with self.store.rehydrate(spilled.reference) as source:
                body = source.read(spilled.length + 1)
        except OSError as exc:
            raise SerializationError(f"{what}: its body could not be read: {exc}") from exc
        return spilled.check(body)

    def load_request_bodies(
        self, spilled: list[tuple[str, bytes]]
    ) -> dict[str, bytes | SerializationError]:
        """Taken requests' bodies by id, read back (blocking); an error in place of each that
        cannot be read (the request is dead-lettered with it)."""
        loaded: dict[str, bytes | SerializationError] = {}
        for request_id, data in spilled:
            try:
                loaded[request_id] = self.load_body(data, f"request {request_id}")
            except SerializationError as exc:
                loaded[request_id] = exc
            except (PrqError, OSError) as exc:
                loaded[request_id] = SerializationError(str(exc))
        return loaded

    def delete_request_data(self, request: Request, body: bytes) -> None:
        """Remove a request's streams and the body its marker names (blocking): its call
        ended, and it never ran."""
        self.delete(request.streams)
        self.delete_body(body)

    def delete_body(self, data: bytes) -> None:
        """Remove the body a marker names (blocking; errors only logged: the sweep removes
        it after its expiry)."""
        if self.store is None or not bodies.is_spilled(data):
            return
        try:
            self.store.delete(bodies.parse(data).reference)
        except Exception as exc:
            logger.warning("could not delete a stored body error=%s", exc)

    def sweep_due(self, now: float) -> bool:
        return self.store is not None and now >= self._next_sweep

    def sweep(self) -> int:
        """Extend the data of the requests this node holds, then remove expired data
        (blocking); how many pieces were removed."""
        settings = self.settings
        self._next_sweep = time.monotonic() + settings.data_loss_check_interval_s
        if self.store is None:
            return 0
        # till the next sweep, and then as long as the request may live on without a holder
        life_s = settings.request_data_ttl_s(settings.pickup_timeout_s, settings.max_attempts)
        until_ms = _now_ms() + int((life_s + settings.data_loss_check_interval_s) * 1000)
        for reference in self.held():
            try:
                self.store.extend(reference, until_ms)
            except Exception as exc:
                logger.warning("could not extend held data ref=%r error=%s", reference, exc)
        try:
            removed = self.store.cleanup(_now_ms())
        except Exception as exc:
            logger.warning("stream store cleanup failed error=%s", exc)
            return 0
        if removed:
            logger.info("expired streams removed count=%d", removed)
        return removed
