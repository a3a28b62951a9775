"""The check of an endpoint's first use on a node: refuse one that still holds the previous
prq version's scheduling lanes, which this version would never take from."""

from __future__ import annotations

from prq.core.errors import ConfigurationError
from prq.protocol.effects import Call, Exec, Flow
from prq.protocol.flows.context import Context

__all__ = ["layout_flow", "old_layout_message"]


def layout_flow(ctx: Context, endpoint: str) -> Flow[None]:
    """Refuse an endpoint that still holds the previous layout's scheduling lanes (ids queued
    there would never be taken by this version): one EXISTS, sent once per endpoint per node
    (its first use), before anything is queued or taken. Raises ConfigurationError."""
    keys = ctx.keys.endpoint(endpoint)
    replies = yield Exec((Call(("EXISTS", keys.old_levels)),))
    assert isinstance(replies, list)
    if replies[0]:
        raise ConfigurationError(old_layout_message(endpoint, keys.old_levels, keys.tag))


def old_layout_message(endpoint: str, old_levels: str, tag: str) -> str:
    """What to do about an endpoint whose requests were queued by the previous layout."""
    return (
        f"endpoint {endpoint!r} holds requests queued by a previous prq version, in the "
        f"previous scheduling layout ({old_levels} exists), which this version does not read. "
        "Drain that endpoint first with receivers of the previous prq version (stop its "
        "senders; when the previous receivers have taken everything, that key is gone), or, "
        f"if nothing queued there is worth keeping, delete {old_levels} and the keys matching "
        f"{tag}:q:* (those requests then expire unanswered); then start again."
    )
