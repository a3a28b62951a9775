"""Reading an endpoint's queue in the order takes hand it out (scripts/_queue.lua).

Queued ids live in one sorted set per priority level, scored by a virtual start time that lets
producers take turns; the set `prq:{e}:lv` lists the levels that hold ids. These flows only read
(ZRANGE, ZCARD), so the admin view drives them as its read-only user, and tests use them to
look at a queue.

Listing order: highest priority first, then by virtual start time within a level. That is the
order takes follow, but for the share a lower level gets while higher ones hold work (every
tenth take a level makes passes down, see _queue.lua).
"""

from __future__ import annotations

from dataclasses import dataclass

from prq._types import Call, Exec, Flow, Reply, first_reply, reply_list, reply_text
from prq.flows import Context
from prq.keys import EndpointKeys
from prq.models import MAX_PRIORITY, MIN_PRIORITY, validate_endpoint

__all__ = ["MAX_LEVELS", "Level", "levels_call", "levels_flow", "levels_from", "queued_ids_flow"]

#: Most priority levels one read looks at (the highest ones). prq queues at most
#: 2**32 distinct priorities; a deployment using more than this many at once sees the rest
#: left out of depth and listings.
MAX_LEVELS = 1000


@dataclass(frozen=True, slots=True)
class Level:
    """One priority level that holds queued ids, with the first `head` of them (take order)."""

    priority: int
    depth: int
    head: tuple[str, ...] = ()


def levels_call(keys: EndpointKeys) -> Call:
    """The first read of `levels_flow` (send it with other reads; `levels_from` goes on)."""
    return Call(("ZRANGE", keys.levels, 0, MAX_LEVELS - 1, "REV"))


def levels_flow(ctx: Context, endpoint: str, head: int = 0) -> Flow[list[Level]]:
    """The endpoint's non-empty levels, highest priority first, each with its first `head` ids;
    two round trips (one when nothing is queued)."""
    keys = ctx.keys.endpoint(validate_endpoint(endpoint))
    replies = yield Exec((levels_call(keys),))
    return (yield from levels_from(keys, first_reply(replies), head))


def levels_from(keys: EndpointKeys, reply: Reply, head: int = 0) -> Flow[list[Level]]:
    """`levels_flow` after its first read, from that read's reply."""
    priorities = [p for p in (_priority(v) for v in reply_list(reply)) if p is not None]
    if not priorities:
        return []
    calls: list[Call] = []
    for priority in priorities:
        calls.append(Call(("ZCARD", keys.level(priority))))
        if head > 0:
            calls.append(Call(("ZRANGE", keys.level(priority), 0, head - 1)))
    replies = yield Exec(tuple(calls))
    assert isinstance(replies, list)
    step = 2 if head > 0 else 1
    levels = []
    for i, priority in enumerate(priorities):
        depth = replies[i * step]
        ids = tuple(reply_text(v) for v in reply_list(replies[i * step + 1])) if head > 0 else ()
        if isinstance(depth, int) and depth > 0:
            levels.append(Level(priority, depth, ids))
    return levels


def queued_ids_flow(
    ctx: Context, endpoint: str, offset: int, limit: int
) -> Flow[tuple[int, list[str]]]:
    """(ids queued in all, the ids at positions offset..offset+limit-1 in listing order)."""
    keys = ctx.keys.endpoint(validate_endpoint(endpoint))
    levels = yield from levels_flow(ctx, endpoint)
    total = sum(level.depth for level in levels)
    calls: list[Call] = []
    start = 0  # position of the level's first id in the listing
    for level in levels:
        lo, hi = max(offset, start), min(offset + limit, start + level.depth)
        if lo < hi:
            calls.append(Call(("ZRANGE", keys.level(level.priority), lo - start, hi - start - 1)))
        start += level.depth
    if not calls:
        return total, []
    replies = yield Exec(tuple(calls))
    assert isinstance(replies, list)
    return total, [reply_text(v) for reply in replies for v in reply_list(reply)]


def _priority(value: Reply) -> int | None:
    """A level's name as prq writes it (a decimal priority); None for anything else."""
    text = reply_text(value)
    try:
        priority = int(text)
    except ValueError:
        return None
    if str(priority) != text or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        return None
    return priority
