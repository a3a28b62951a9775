"""`status_flow`: where a request stands, read from its record in either form (a hash, or the
string a BulkClient batch queued until its pickup)."""

from __future__ import annotations

from collections.abc import Sequence

from prq.core.errors import PrqError, SerializationError
from prq.core.lifecycle import RequestState, RequestStatus
from prq.core.records import QUEUED_HEAD_BYTES, queued_head
from prq.protocol.effects import Call, Flow, Reply, first_reply
from prq.protocol.flows.context import Context, exec_calls
from prq.protocol.flows.registry import locate_flow
from prq.protocol.scripts.replies import HANDED

__all__ = ["STATUS_READS", "status_flow"]


#: How many times status() reads a record that changes its form meanwhile.
STATUS_READS = 3
#: Fields status() reads from a request hash, in order.
_STATUS_FIELDS = ("st", "why", "att", "ct", "tk", "dn")


def _record_fields_flow(key: str, names: Sequence[str]) -> Flow[Reply]:
    """HMGET of `names` for a record in either form: a request queued by BulkClient is a
    string until its pickup (prq.core.records), whose head is read, not its body. Should a script
    turn it into a hash between the two reads, it is read again (at most STATUS_READS times)."""
    for _ in range(STATUS_READS):
        kind = first_reply((yield exec_calls(Call(("TYPE", key)))))
        if kind not in (b"string", "string"):
            return first_reply((yield exec_calls(Call(("HMGET", key, *names)))))
        try:
            head = first_reply(
                (yield exec_calls(Call(("GETRANGE", key, 0, QUEUED_HEAD_BYTES - 1))))
            )
        except PrqError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            continue  # a hash now
        if isinstance(head, bytes):
            fields = queued_head(head) or {"st": b"queued"}  # damaged: still queued
            return [fields.get(name) for name in names]
    raise SerializationError(f"record {key} kept changing its form while it was read")


def status_flow(ctx: Context, request_id: str, endpoint: str | None) -> Flow[RequestStatus]:
    """Where a request stands; `endpoint` None means look it up by id."""
    if endpoint is None:
        endpoint = yield from locate_flow(ctx, request_id)
        if endpoint is None:
            return RequestStatus(id=request_id, state=RequestState.UNKNOWN)
    key = ctx.keys.endpoint(endpoint).request(request_id)
    values = yield from _record_fields_flow(key, _STATUS_FIELDS)
    if not isinstance(values, list) or len(values) != len(_STATUS_FIELDS):
        raise SerializationError(f"unexpected HMGET reply from Redis: {values!r:.200}")
    st, why, att, ct, tk, dn = (v.decode() if isinstance(v, bytes) else None for v in values)
    if st is None:
        return RequestStatus(id=request_id, state=RequestState.UNKNOWN, endpoint=endpoint)
    if st == HANDED:
        st, tk = RequestState.QUEUED, None  # handed to a receiver, not confirmed: not picked up
    try:
        state = RequestState(st)
    except ValueError as exc:
        raise SerializationError(f"request {request_id} has an unknown state {st!r}") from exc
    return RequestStatus(
        id=request_id,
        state=state,
        endpoint=endpoint,
        reason=why or None,
        attempt=int(att or 0),
        created_ms=int(ct) if ct else None,
        taken_ms=int(tk) if tk else None,
        done_ms=int(dn) if dn else None,
    )
