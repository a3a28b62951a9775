"""Dead letters: requests that must not run, kept per endpoint with a reason for an operator.

A request is dead-lettered when its stored bytes cannot be decoded into a `Request` for its
endpoint (truncated or foreign bytes written into Redis, another id or endpoint inside), and,
with `at_least_once` delivery, when it exhausts its attempts. Its caller is answered with the
error as well; the dead letter keeps the stored bytes, the reason, the attempt count and the
time, so the request can be looked at, replayed (queued again under the same id, once) or
purged. Dead letters expire after `dead_letter_ttl_s`, and an endpoint keeps at most
`dead_letter_max` of them (oldest dropped first); see dead_letter.lua.

Listings read stored bodies only within bounds (`bodies_to_read`): sizes come from HSTRLEN,
and a body too large to read for a listing is listed with its size and no preview, marked so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from prq.core.errors import SerializationError, SignatureError
from prq.core.names import readable_endpoint, validate_endpoint
from prq.protocol.effects import Call, Exec, Flow, Reply, first_reply, reply_list, reply_text
from prq.protocol.flows.context import Context
from prq.protocol.flows.registry import locator_calls, registry_calls
from prq.protocol.scripts.loading import DEAD_LETTER, PURGE_DEAD, REPLAY_DEAD
from prq.protocol.signing import unwrap

__all__ = [
    "BODY_READ_BUDGET_BYTES",
    "BODY_READ_MAX_BYTES",
    "DeadLetter",
    "ReplayOutcome",
    "bodies_to_read",
    "dead_letter_call",
    "dead_letters_flow",
    "purge_dead_letters_flow",
    "replay_dead_letter_flow",
]

#: How much of a dead request's stored bytes a listing shows (as text).
PREVIEW_BYTES = 1024
#: Most dead letters one listing returns.
MAX_LISTED = 1000
#: A listing (of dead letters, or of queued requests: prq.ops.queue_view) reads a stored body only
#: when it is at most this long, and only while the bodies it read total at most the budget: one
#: listing moves a bounded number of bytes through Redis and its reader, however large the
#: bodies (up to max_body_bytes each) and however many are listed. The others show their size
#: only, marked `body_read=False`.
BODY_READ_MAX_BYTES = 1024 * 1024
BODY_READ_BUDGET_BYTES = 8 * 1024 * 1024

ReplayOutcome = Literal["replayed", "live", "missing"]


class DeadLetter(BaseModel):
    """One dead-lettered request, as listed."""

    model_config = ConfigDict(frozen=True)

    id: str
    endpoint: str
    #: Why it must not run, e.g. "undecodable: ..." or "attempts_exhausted".
    reason: str
    #: Attempts made before it was dead-lettered.
    attempts: int
    #: When it was dead-lettered, ms since the epoch.
    dead_at_ms: int
    #: Size of its stored bytes, and their start as text (invalid UTF-8 replaced).
    body_bytes: int
    body_preview: str
    #: The preview is less than the whole body: its first PREVIEW_BYTES only, or nothing when
    #: the body was not read.
    body_preview_cut: bool = False
    #: False when the body was too large to read for a listing (over BODY_READ_MAX_BYTES, or
    #: past the listing's BODY_READ_BUDGET_BYTES): the preview is empty, the size is right.
    body_read: bool = True


def dead_letter_call(
    ctx: Context,
    endpoint: str,
    request_id: str,
    body: bytes,
    reason: str,
    attempts: int,
    *,
    priority: int | None = None,
    producer: str | None = None,
) -> Call:
    """The script call that dead-letters one request (send it with the step that caused it).
    `priority` and `producer`, when known, are where a replay queues it again."""
    now_ms = ctx.wall_ms()
    info: dict[str, object] = {"reason": reason[:500], "attempts": attempts, "at": now_ms}
    if priority is not None:
        info["priority"] = priority
    if producer is not None:
        info["producer"] = producer
    details = json.dumps(info)
    return DEAD_LETTER.call(
        ctx.keys.endpoint(endpoint).dead,
        (
            request_id,
            details,
            body,
            now_ms,
            int(ctx.settings.dead_letter_ttl_s * 1000),
            ctx.settings.dead_letter_max,
        ),
    )


def dead_letters_flow(
    ctx: Context, endpoint: str, *, offset: int = 0, limit: int = 100
) -> Flow[list[DeadLetter]]:
    """Dead letters of `endpoint`, newest first."""
    if offset < 0 or not 1 <= limit <= MAX_LISTED:
        raise ValueError(f"offset must be >= 0 and limit within 1..{MAX_LISTED}")
    ids_key, details_key, bodies_key = ctx.keys.endpoint(readable_endpoint(endpoint)).dead
    replies = yield Exec((Call(("ZRANGE", ids_key, offset, offset + limit - 1, "REV")),))
    ids = [reply_text(i) for i in reply_list(first_reply(replies))]
    if not ids:
        return []
    sizes = tuple(Call(("HSTRLEN", bodies_key, request_id)) for request_id in ids)
    replies = yield Exec((Call(("HMGET", details_key, *ids)), *sizes))
    assert isinstance(replies, list)
    details, lengths = reply_list(replies[0]), [_int(n) for n in replies[1:]]
    read = [request_id for request_id, ok in zip(ids, bodies_to_read(lengths), strict=True) if ok]
    bodies: dict[str, Reply] = {}
    if read:
        replies = yield Exec((Call(("HMGET", bodies_key, *read)),))
        bodies = dict(zip(read, reply_list(first_reply(replies)), strict=True))
    letters = []
    for request_id, raw, size in zip(ids, details, lengths, strict=True):
        body = bodies.get(request_id)
        if raw is None or (request_id in bodies and body is None):
            continue  # dropped between the reads
        info = _details(raw)
        if body is None:
            preview, cut = "", True
        else:
            data = unwrap(body if isinstance(body, bytes) else reply_text(body).encode())
            preview = data[:PREVIEW_BYTES].decode("utf-8", errors="replace")
            cut = len(data) > PREVIEW_BYTES
        letters.append(
            DeadLetter(
                id=request_id,
                endpoint=endpoint,
                reason=str(info.get("reason", "")),
                attempts=_int(info.get("attempts")),
                dead_at_ms=_int(info.get("at")),
                body_bytes=size,
                body_preview=preview,
                body_preview_cut=cut,
                body_read=body is not None,
            )
        )
    return letters


def bodies_to_read(sizes: Sequence[int]) -> list[bool]:
    """Which of a listing's stored bodies, of these sizes in listing order, it may read: each
    at most BODY_READ_MAX_BYTES, together at most BODY_READ_BUDGET_BYTES."""
    chosen, total = [], 0
    for size in sizes:
        ok = size <= BODY_READ_MAX_BYTES and total + size <= BODY_READ_BUDGET_BYTES
        total += size if ok else 0
        chosen.append(ok)
    return chosen


def replay_dead_letter_flow(ctx: Context, endpoint: str, request_id: str) -> Flow[ReplayOutcome]:
    """Queue a dead letter again under its id (see replay_dead.lua), its endpoint registered
    (and its locator written, with `request_locators`) so that status and cancel by id find
    it, and with a signing key, its signature renewed; what happened."""
    keys = ctx.keys.endpoint(validate_endpoint(endpoint))
    renew = () if ctx.signer is None else (yield from _renewal(ctx, endpoint, request_id))
    settings = ctx.settings
    now_ms = ctx.wall_ms()
    pickup_ms = int(settings.pickup_timeout_s * 1000)
    call = REPLAY_DEAD.call(
        (
            *keys.dead,
            keys.request(request_id),
            keys.levels,
            keys.sequence,
            keys.level_prefix,
            keys.numbers,
        ),
        (
            request_id,
            now_ms,
            pickup_ms,
            int(settings.request_ttl_s(settings.pickup_timeout_s) * 1000),
            int(settings.list_ttl_s * 1000),
            keys.pulse_channel,
        ),
    )
    beside = [
        *locator_calls(ctx.keys, settings, request_id, endpoint, settings.pickup_timeout_s),
        *registry_calls(ctx.keys, settings, [endpoint], now_ms),
    ]
    replies = yield Exec((*renew, call, *beside))
    assert isinstance(replies, list)
    outcome = reply_text(replies[len(renew)])
    if outcome not in ("replayed", "live", "missing"):
        raise SerializationError(f"unexpected replay_dead reply from Redis: {outcome!r:.100}")
    return outcome  # type: ignore[return-value]


def _renewal(ctx: Context, endpoint: str, request_id: str) -> Flow[tuple[Call, ...]]:
    """The call that renews a dead letter's signature for as long as a request enqueued now
    gets (prq.protocol.signing), if its envelope is authentic: an operator who replays a dead letter
    vouches for it, however old it is. A forged or tampered one is replayed as it is, and is
    dead-lettered again with its reason."""
    signer = ctx.signer
    assert signer is not None
    keys = ctx.keys.endpoint(endpoint)
    body = first_reply((yield Exec((Call(("HGET", keys.dead[2], request_id)),))))
    if not isinstance(body, bytes):
        return ()
    valid_ms = int(ctx.settings.signature_renewal_s() * 1000)
    try:
        header = signer.renewal("request", request_id, endpoint, body, ctx.wall_ms() + valid_ms)
    except SignatureError:
        return ()
    ttl_ms = valid_ms + int(ctx.settings.signing_clock_skew_s * 1000)
    return (Call(("SET", keys.renewal(request_id), header, "PX", ttl_ms)),)


def purge_dead_letters_flow(
    ctx: Context, endpoint: str, request_ids: list[str] | None = None
) -> Flow[int]:
    """Drop the named dead letters (None: all of the endpoint's; an empty list: none); how many
    were dropped."""
    keys = ctx.keys.endpoint(readable_endpoint(endpoint))
    if request_ids is not None and not request_ids:
        return 0
    reply = first_reply((yield Exec((PURGE_DEAD.call(keys.dead, tuple(request_ids or ())),))))
    if not isinstance(reply, int):
        raise SerializationError(f"unexpected purge_dead reply from Redis: {reply!r:.100}")
    return reply


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _details(raw: Reply) -> dict[str, object]:
    try:
        found = json.loads(reply_text(raw))
    except ValueError:
        return {"reason": "unreadable dead letter details"}
    return found if isinstance(found, dict) else {"reason": "unreadable dead letter details"}
