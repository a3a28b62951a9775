"""Ending a request before its answer: withdraw (before pickup: it never runs) and cancel
(from any node, before or after pickup; the endpoint looked up by id when not given)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from prq.core.models import Request
from prq.protocol.effects import Flow, first_reply
from prq.protocol.flows.context import Context, exec_calls, to_ms
from prq.protocol.flows.registry import locate_flow
from prq.protocol.scripts.replies import RequestSnapshot
from prq.protocol.scripts.request_state import cancel_call, parse_withdraw, withdraw_call

__all__ = ["cancel_flow", "cancel_step", "withdraw_flow", "withdraw_own_flow", "withdraw_step"]


def withdraw_flow(ctx: Context, request: Request, reason: str) -> Flow[RequestSnapshot]:
    """Withdraw a request not yet picked up; the snapshot says where it stands now."""
    snapshot, _mine = yield from withdraw_step(ctx, request.endpoint, request.id, reason)
    return snapshot


def withdraw_own_flow(
    ctx: Context, endpoint: str, request_id: str, reason: str = "cancelled"
) -> Flow[bool]:
    """Withdraw a request not yet picked up; True if this call withdrew it."""
    _snapshot, mine = yield from withdraw_step(ctx, endpoint, request_id, reason)
    return mine


def cancel_flow(
    ctx: Context,
    request_id: str,
    endpoint: str | None,
    reason: str = "cancelled",
    on_cancelled: Callable[[str], None] | None = None,
) -> Flow[bool]:
    """Cancel a request from any node, before or after pickup; True if this call did it
    (then `on_cancelled` is told the endpoint).

    `endpoint` None means look it up by id (the locator key)."""
    if endpoint is None:
        endpoint = yield from locate_flow(ctx, request_id)
        if endpoint is None:
            return False
    _snapshot, mine = yield from cancel_step(ctx, endpoint, request_id, reason)
    if mine and on_cancelled is not None:
        on_cancelled(endpoint)
    return mine


def cancel_step(
    ctx: Context, endpoint: str, request_id: str, reason: str
) -> Flow[tuple[RequestSnapshot, bool]]:
    """One cancel call: the request's snapshot after it, and whether this call cancelled it."""
    replies = yield exec_calls(
        cancel_call(
            ctx.keys.endpoint(endpoint),
            request_id,
            reason,
            to_ms(ctx.settings.cancel_marker_ttl_s),
            uuid.uuid4().hex,
        )
    )
    return parse_withdraw(first_reply(replies))


def withdraw_step(
    ctx: Context, endpoint: str, request_id: str, reason: str
) -> Flow[tuple[RequestSnapshot, bool]]:
    """One withdraw call: the request's snapshot after it, and whether this call withdrew it."""
    replies = yield exec_calls(
        withdraw_call(
            ctx.keys.endpoint(endpoint),
            request_id,
            reason,
            to_ms(ctx.settings.cancel_marker_ttl_s),
            ctx.wall_ms(),
            uuid.uuid4().hex,
        )
    )
    return parse_withdraw(first_reply(replies))
