"""A request's body in its record (prq.core.records, scripts/_body.lua): whole in the queued form of
a bulk request, then, from its pickup, kept in pieces of at most 64 bytes while it is small, so
the record stays in Redis's compact encoding; handed out whole, byte for byte, at every size
around the piece boundaries."""

from __future__ import annotations

import pytest
import redis

from prq import Request, Response
from prq.bulk import BulkClient
from prq.core.models import encode_stored_request
from prq.core.records import BODY_PIECE_BYTES, CHUNKED_MAX_BYTES, body_fields
from tests.queue_facades import QueueFactory
from tests.stored_bodies import body_field_names, read_body

pytestmark = pytest.mark.integration

ENDPOINT = "poll://record-body"
#: Body sizes around every boundary: one piece, two, the last piece full or not, the largest
#: body kept in pieces, and the smallest kept whole.
SIZES = [1, 63, 64, 65, 127, 128, 129, 1000, CHUNKED_MAX_BYTES - 1, CHUNKED_MAX_BYTES]
SIZES += [CHUNKED_MAX_BYTES + 1, 3 * CHUNKED_MAX_BYTES]


def request_of_size(index: int, size: int) -> tuple[Request, bytes]:
    """A request whose stored JSON is exactly `size` bytes, or the shortest one there is."""
    request = Request(endpoint=ENDPOINT, method="m", id=f"r{index}", producer="p", params="")
    base = len(encode_stored_request(request))
    request = request.model_copy(update={"params": "x" * max(0, size - base)})
    return request, encode_stored_request(request)


async def test_bodies_of_every_size_are_stored_in_pieces_and_handed_out_whole(
    make_queue: QueueFactory, redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given requests whose stored bodies have sizes around the piece boundaries
    made = [request_of_size(i, size) for i, size in enumerate(SIZES)]
    with BulkClient.from_url(redis_url, prefix=key_prefix) as bulk:
        assert bulk.enqueue_many([request for request, _ in made]).accepted == len(made)
    keys = make_queue().keys.endpoint(ENDPOINT)

    # Then each waits as one string in the queued form (prq.core.records), its body whole
    for request, body in made:
        record = keys.request(request.id)
        assert redis_client.type(record) == b"string", len(body)
        assert read_body(redis_client, record) == body

    # And its pickup turns it into a hash holding the body in the fields prq.core.records names, in
    # Redis's compact encoding while small; the receiver gets every request whole, and
    # answering it leaves no piece of it behind
    # (the fields are kept, emptied, by the write that stores the answer)
    receiver = make_queue()
    for _ in made:
        pending = await receiver.dequeue(ENDPOINT, timeout_s=10)
        assert pending is not None
        request, body = next(m for m in made if m[0].id == pending.id)
        assert pending.request == request
        record = keys.request(pending.id)
        stored: dict[bytes, bytes] = redis_client.hgetall(record)  # type: ignore[assignment]
        names = body_field_names(set(stored))
        pieces = {k.decode(): v for k, v in stored.items() if k in names}
        assert pieces == body_fields(body), len(body)
        assert read_body(redis_client, record) == body
        if len(body) <= CHUNKED_MAX_BYTES:
            assert all(len(v) <= BODY_PIECE_BYTES for v in pieces.values()), len(body)
        if len(body) <= 16 * BODY_PIECE_BYTES:
            assert redis_client.object("encoding", record) == b"listpack", len(body)
        await receiver.apply_response(Response(id=pending.id, result=None))
        left: dict[bytes, bytes] = redis_client.hgetall(record)  # type: ignore[assignment]
        assert not [v for f, v in left.items() if f in body_field_names(set(left)) and v], left
        assert read_body(redis_client, record) is None
