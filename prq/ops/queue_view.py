"""The Inspector's listings of an endpoint's requests: a page of its queued requests in take
order (read in either stored form, hash or queued-form string), and its dead letters. A stored
body is read only within prq.protocol.dead's bounds; one beyond them is listed by size only.
"""

from __future__ import annotations

from typing import Any

from prq.core import bodies
from prq.core.errors import SerializationError
from prq.core.keys import EndpointKeys
from prq.core.models import decode_stored_request
from prq.core.names import readable_endpoint
from prq.core.records import (
    QUEUED_HEAD_BYTES,
    body_size_bound,
    first_fields,
    join_body,
    queued_body_size,
    queued_head,
    queued_values,
    rest_fields,
)
from prq.ops.answers import QueuedItem, QueuedPage
from prq.ops.reading import (
    InspectorBase,
    _raise_unless_wrongtype,
    _reading,
    _server_ms,
    _text,
)
from prq.protocol.dead import DeadLetter, bodies_to_read, dead_letters_flow
from prq.protocol.flows.context import Context
from prq.protocol.levels import queued_ids_flow
from prq.protocol.signing import unwrap

__all__ = ["MAX_PAGE", "QueueView"]

#: Most queued requests one page may list.
MAX_PAGE = 500


class QueueView(InspectorBase):
    """The Inspector's listings of one endpoint's requests."""

    async def queued(self, endpoint: str, offset: int = 0, limit: int = 50) -> QueuedPage:
        """A page of the endpoint's queued requests in take order (QueuedPage); ids that are no
        longer queued, about to be skipped by a take, are left out of the page."""
        endpoint = readable_endpoint(endpoint)
        if offset < 0 or not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"offset must be >= 0 and limit within 1..{MAX_PAGE}")
        keys = self.keys.endpoint(endpoint)
        ctx = Context(self.keys, self.settings, node_id="inspector")
        ((total, ids),) = await self._read_flows([queued_ids_flow(ctx, endpoint, offset, limit)])
        with _reading():
            # each record read both ways in one round trip: the calls of the other form answer
            # WRONGTYPE (a request queued by BulkClient is a string until picked up:
            # prq.core.records); a string's head is read, not its body
            pipe = self.client.pipeline(transaction=False)
            pipe.execute_command("TIME")
            for request_id in ids:
                key = keys.request(request_id)
                pipe.hmget(key, ["st", "ct", "bk"])
                pipe.hstrlen(key, "b")
                pipe.strlen(key)
                pipe.getrange(key, 0, QUEUED_HEAD_BYTES - 1)
            now_reply, *replies = await pipe.execute(raise_on_error=False)
        if isinstance(now_reply, Exception):
            raise now_reply
        now_ms = _server_ms(now_reply)
        queued, strung = [], set()
        for n, request_id in enumerate(ids):
            hashed, piece_size, length, head = replies[4 * n : 4 * n + 4]
            if isinstance(hashed, list):
                st, created, count = hashed
                if _text(st) == "queued":
                    queued.append((request_id, created, body_size_bound(piece_size, count)))
            elif isinstance(length, int) and isinstance(head, bytes):
                fields = queued_head(head) or {}
                queued.append((request_id, fields.get("ct"), queued_body_size(head, length)))
                strung.add(request_id)
            else:
                _raise_unless_wrongtype(hashed, length, head)
        wanted = bodies_to_read([size for _, _, size in queued])
        read = [request_id for (request_id, _, _), ok in zip(queued, wanted, strict=True) if ok]
        bodies = await self._bodies(keys, [i for i in read if i not in strung])
        bodies |= await self._string_bodies(keys, [i for i in read if i in strung])
        items = []
        for request_id, created, size in queued:
            if request_id not in bodies:
                items.append(_unread_item(request_id, created, size, now_ms))
            elif (body := bodies[request_id]) is not None:  # else: gone since it was listed
                items.append(_queued_item(request_id, endpoint, body, created, now_ms))
        return QueuedPage(
            endpoint=endpoint, offset=offset, limit=limit, total=int(total), items=items
        )

    async def _bodies(self, keys: EndpointKeys, ids: list[str]) -> dict[str, bytes | None]:
        """The stored bodies of these requests (None: the request is gone), one round trip."""
        if not ids:
            return {}
        with _reading():
            pipe = self.client.pipeline(transaction=False)
            for request_id in ids:
                pipe.hmget(keys.request(request_id), first_fields())
            firsts = dict(zip(ids, await pipe.execute(), strict=True))
            pieced = {i: rest_fields(count) for i, (_, count) in firsts.items()}
            pieced = {i: names for i, names in pieced.items() if names}
            rests: dict[str, list[bytes | None]] = {}
            if pieced:  # bodies kept in pieces (prq.core.records): a second read for the rest
                pipe = self.client.pipeline(transaction=False)
                for request_id, names in pieced.items():
                    pipe.hmget(keys.request(request_id), names)
                rests = dict(zip(pieced, await pipe.execute(), strict=True))
        return {i: join_body(first, rests.get(i, [])) for i, (first, _) in firsts.items()}

    async def _string_bodies(self, keys: EndpointKeys, ids: list[str]) -> dict[str, bytes | None]:
        """The bodies of these records in the queued form (None: picked up or gone since they
        were listed: MGET answers nil for a hash), one round trip."""
        if not ids:
            return {}
        with _reading():
            raws = await self.client.mget([keys.request(i) for i in ids])
        return {
            i: queued_values(raw, ["b"])[0] if isinstance(raw, bytes) else None
            for i, raw in zip(ids, raws, strict=True)
        }

    async def dead_letters(
        self, endpoint: str, offset: int = 0, limit: int = 100
    ) -> list[DeadLetter]:
        """The endpoint's dead letters, newest first, as `Queue.dead_letters` lists them (raises
        InvalidEndpoint for a bad name, ValueError for a bad page: limit within 1..1000)."""
        ctx = Context(self.keys, self.settings, node_id="inspector")
        flow = dead_letters_flow(ctx, endpoint, offset=offset, limit=limit)
        (letters,) = await self._read_flows([flow])
        return letters


def _created(created: Any, now_ms: int) -> tuple[int, float]:
    """A request's creation time (ms since the epoch, 0 when unknown) and its age, seconds."""
    created_ms = int(_text(created) or 0)
    return created_ms, max(0.0, (now_ms - created_ms) / 1000) if created_ms else 0.0


def _unread_item(request_id: str, created: Any, size: int, now_ms: int) -> QueuedItem:
    created_ms, age_s = _created(created, now_ms)
    return QueuedItem(
        id=request_id, method="", service="", priority=None, producer=None,
        created_ms=created_ms, age_s=age_s, body_bytes=size, body_read=False,
    )  # fmt: skip


def _queued_item(
    request_id: str, endpoint: str, body: bytes, created: Any, now_ms: int
) -> QueuedItem:
    created_ms, age_s = _created(created, now_ms)
    size = len(body)
    try:
        data = unwrap(body)
        request = decode_stored_request(bodies.stub(data), endpoint, request_id)
        if bodies.is_spilled(data):  # kept beside Redis (prq.core.bodies): its size is the body's
            size = bodies.parse(data).length
    except SerializationError as exc:
        return QueuedItem(
            id=request_id, method="", service="", priority=0, producer=None,
            created_ms=created_ms, age_s=age_s, body_bytes=size, error=str(exc)[:200],
        )  # fmt: skip
    return QueuedItem(
        id=request_id, method=request.method, service=request.service,
        priority=request.priority, producer=request.producer, created_ms=created_ms,
        age_s=age_s, body_bytes=size, error=None,
    )  # fmt: skip
