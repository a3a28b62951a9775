"""Forgetting an endpoint: an operator removes it from the registry (`prq:endpoints`), e.g. a
name made by a typo that would otherwise sit in the admin views for a day.

Forgetting removes only the registry entry and the endpoint's receiver list (`prq:{e}:rcv`,
presence metadata that the next report of a live receiver writes again); it never removes or
cancels a request, and never touches limits or dead letters. By default it is refused while
the endpoint holds work or has a live receiver (its figures are in the outcome); `force`
forgets it anyway, and its queued requests stay queued until taken or expired by their TTL.

While it is forgotten, a lookup of one of its requests by id alone (`status`, `cancel` from a
node that did not send it, without `request_locators`) does not find it: such lookups ask the
endpoints in the registry. That is the other reason a busy endpoint is not forgotten by default.

Nothing stops the endpoint from coming back, and that is the point: a receiver still serving
it, or a node that used it lately, lists it again at its next presence report (every 5 s,
prq.protocol.presence), and a node's first enqueue to it registers it again at once. The check and
the removal are two round trips: an enqueue between them is listed again by its node's next report.
"""

from __future__ import annotations

from pydantic import BaseModel

from prq.core.keys import encode_endpoint
from prq.core.names import readable_endpoint
from prq.protocol.effects import Call, Exec, Flow
from prq.protocol.flows.context import Context
from prq.protocol.levels import levels_flow
from prq.protocol.presence import RECEIVER_LIVE_REPORTS, presence_interval_s

__all__ = ["ForgetOutcome", "forget_endpoint_flow"]


class ForgetOutcome(BaseModel):
    """What forgetting an endpoint found and did."""

    endpoint: str
    #: The endpoint was in the registry.
    registered: bool
    #: The registry entry was removed (False: not registered, or refused because it is busy).
    forgotten: bool
    #: Requests queued for it (they stay queued, forgotten or not).
    depth: int
    #: Requests picked up and not answered yet.
    in_flight: int
    #: Receivers that reported serving it lately.
    receivers: int

    @property
    def busy(self) -> bool:
        """It holds work or has a live receiver: forgetting it needs `force`."""
        return bool(self.depth or self.in_flight or self.receivers)


def forget_endpoint_flow(
    ctx: Context, endpoint: str, *, force: bool = False
) -> Flow[ForgetOutcome]:
    """Remove `endpoint` from the registry unless it is busy (or with `force`); see the module.
    Takes any name `readable_endpoint` takes, so names an earlier version left can go too."""
    endpoint = readable_endpoint(endpoint)
    keys = ctx.keys.endpoint(endpoint)
    encoded = encode_endpoint(endpoint)
    replies = yield Exec((Call(("ZSCORE", ctx.keys.endpoints, encoded)),))
    assert isinstance(replies, list)
    # The node's clock, not Redis's TIME: a cluster pipeline cannot carry TIME (it names no
    # key), and the windows below are many seconds wide; a node far behind Redis's clock
    # could only miss a live receiver, which lists the endpoint again within seconds.
    now_ms = ctx.wall_ms()
    registered = replies[0] is not None
    in_flight_from = now_ms - int(ctx.settings.in_flight_ttl_s() * 1000)
    live_from = now_ms - int(RECEIVER_LIVE_REPORTS * presence_interval_s(ctx.settings) * 1000)
    counts = yield Exec(
        (
            Call(("ZCOUNT", keys.running, in_flight_from, "+inf")),
            Call(("ZCOUNT", keys.receivers, live_from, "+inf")),
        )
    )
    assert isinstance(counts, list)
    levels = yield from levels_flow(ctx, endpoint)
    outcome = ForgetOutcome(
        endpoint=endpoint,
        registered=registered,
        forgotten=False,
        depth=sum(level.depth for level in levels),
        in_flight=int(counts[0]),
        receivers=int(counts[1]),
    )
    if not registered or (outcome.busy and not force):
        return outcome
    removed = yield Exec(
        (Call(("ZREM", ctx.keys.endpoints, encoded)), Call(("DEL", keys.receivers)))
    )
    assert isinstance(removed, list)
    return outcome.model_copy(update={"forgotten": removed[0] == 1})
