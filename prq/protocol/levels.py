"""Reading an endpoint's queue in the order takes hand it out (scripts/_queue.lua).

Queued ids live in lanes, per priority level: a front lane (ids given back, taken first) and one
list per producer, whose ids take turns by virtual start time (the lanes sorted set scores each
producer by its first id's time; the id at index i of its list has that time + i). The level's
clock holds its exact depth (`n`), and `prq:{e}:pri` lists the levels that hold ids. These flows
only read (ZRANGE, HGET, LRANGE), so the admin view drives them as its read-only user, and tests
use them to look at a queue.

Listing order: highest priority first, then within a level the order takes follow: the front
lane, then a merge of the producers' lists by virtual time (equal times in the lanes set's
order). That is the order takes follow, but for the share a lower level gets while higher ones
hold work (every tenth take a level makes passes down, see _queue.lua).

Bounds and approximations: a listing reads at most MAX_LISTED_LANES lanes of a level (the ones
taken soonest) and at most offset + limit ids of each; a level served over more producers than
that is listed without the others' ids (its depth still counts them). Ids withdrawn or
cancelled while queued stay in their list until a take skips them, so a listing may show them
(and positions past them shift by as many); callers that show records drop ids that are no
longer queued (prq.ops.queue_view).
"""

from __future__ import annotations

from dataclasses import dataclass

from prq.core.keys import EndpointKeys
from prq.core.models import MAX_PRIORITY, MIN_PRIORITY
from prq.core.names import readable_endpoint
from prq.protocol.effects import Call, Exec, Flow, Reply, first_reply, reply_list, reply_text
from prq.protocol.flows.context import Context

__all__ = [
    "MAX_LEVELS",
    "MAX_LISTED_LANES",
    "Level",
    "levels_call",
    "levels_flow",
    "levels_from",
    "queued_ids_flow",
]

#: Most priority levels one read looks at (the highest ones). prq queues at most
#: 2**32 distinct priorities; a deployment using more than this many at once sees the rest
#: left out of depth and listings.
MAX_LEVELS = 1000

#: Most lanes (the front lane and producers) of one level a listing reads: the first ones in
#: take order. A level with more producers is listed without the rest (see the module doc).
MAX_LISTED_LANES = 100


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
    two round trips (one when nothing is queued; three with `head`)."""
    keys = ctx.keys.endpoint(readable_endpoint(endpoint))
    replies = yield Exec((levels_call(keys),))
    return (yield from levels_from(keys, first_reply(replies), head))


def levels_from(keys: EndpointKeys, reply: Reply, head: int = 0) -> Flow[list[Level]]:
    """`levels_flow` after its first read, from that read's reply."""
    priorities = [p for p in (_priority(v) for v in reply_list(reply)) if p is not None]
    if not priorities:
        return []
    calls = [Call(("HMGET", keys.level(priority), "n")) for priority in priorities]
    if head > 0:
        calls += [_lanes_call(keys, priority) for priority in priorities]
    replies = yield Exec(tuple(calls))
    assert isinstance(replies, list)
    depths = [_count(reply_list(r)[0]) for r in replies[: len(priorities)]]
    heads: list[list[str]] = [[] for _ in priorities]
    if head > 0:
        lanes = replies[len(priorities) :]
        heads = yield from _first_ids(
            keys, [(p, lanes[i], head) for i, p in enumerate(priorities) if depths[i] > 0]
        )
        heads = _spread(heads, depths)
    return [
        Level(priority, depth, tuple(ids))
        for priority, depth, ids in zip(priorities, depths, heads, strict=True)
        if depth > 0
    ]


def queued_ids_flow(
    ctx: Context, endpoint: str, offset: int, limit: int
) -> Flow[tuple[int, list[str]]]:
    """(ids queued in all, the ids at positions offset..offset+limit-1 in listing order)."""
    keys = ctx.keys.endpoint(readable_endpoint(endpoint))
    levels = yield from levels_flow(ctx, endpoint)
    total = sum(level.depth for level in levels)
    wanted: list[tuple[int, int, int]] = []  # priority, first and last+1 position in the level
    start = 0  # position of the level's first id in the listing
    for level in levels:
        lo, hi = max(offset, start), min(offset + limit, start + level.depth)
        if lo < hi:
            wanted.append((level.priority, lo - start, hi - start))
        start += level.depth
    if not wanted:
        return total, []
    replies = yield Exec(tuple(_lanes_call(keys, priority) for priority, _, _ in wanted))
    assert isinstance(replies, list)
    firsts = yield from _first_ids(
        keys, [(p, lanes, hi) for (p, _, hi), lanes in zip(wanted, replies, strict=True)]
    )
    ids = [i for (_, lo, hi), level in zip(wanted, firsts, strict=True) for i in level[lo:hi]]
    return total, ids[:limit]


def _lanes_call(keys: EndpointKeys, priority: int) -> Call:
    """A level's first MAX_LISTED_LANES lanes in take order, with their scores."""
    return Call(("ZRANGE", keys.level_lanes(priority), 0, MAX_LISTED_LANES - 1, "WITHSCORES"))


def _first_ids(keys: EndpointKeys, levels: list[tuple[int, Reply, int]]) -> Flow[list[list[str]]]:
    """For each (priority, its lanes reply, count): the level's first `count` ids in take order
    (the front lane, then the producers' lists merged by virtual time); one round trip."""
    lanes: list[list[tuple[bytes, float]]] = []
    calls: list[Call] = []
    for priority, reply, count in levels:
        flat = _flat(reply_list(reply))
        pairs = [(_bytes(flat[i]), _score(flat[i + 1])) for i in range(0, len(flat) - 1, 2)]
        lanes.append(pairs)
        for member, _ in pairs:
            calls.append(Call(("LRANGE", keys.level_lane(priority, member.decode()), 0, count - 1)))
    if not calls:
        return [[] for _ in levels]
    replies = yield Exec(tuple(calls))
    assert isinstance(replies, list)
    out: list[list[str]] = []
    at = 0
    for (_, _, count), pairs in zip(levels, lanes, strict=True):
        entries: list[tuple[int, float, bytes, str]] = []
        for member, score in pairs:
            ids = [reply_text(v) for v in reply_list(replies[at])]
            at += 1
            front = member == b"f"
            for i, request_id in enumerate(ids):
                # the front lane first, in its order; producers by time, ties by member
                entries.append(
                    (0, i, b"", request_id) if front else (1, score + i, member, request_id)
                )
        entries.sort(key=lambda e: e[:3])
        out.append([e[3] for e in entries[:count]])
    return out


def _flat(reply: list[Reply]) -> list[Reply]:
    """A WITHSCORES reply as [member, score, ...] (RESP3 answers [[member, score], ...])."""
    if reply and isinstance(reply[0], list):
        return [v for pair in reply for v in reply_list(pair)]
    return reply


def _spread(heads: list[list[str]], depths: list[int]) -> list[list[str]]:
    """`_first_ids` answered for the levels with a depth only: put them back in place."""
    it = iter(heads)
    return [next(it) if depth > 0 else [] for depth in depths]


def _count(value: Reply) -> int:
    try:
        return max(0, int(reply_text(value))) if value is not None else 0
    except ValueError:
        return 0


def _bytes(value: Reply) -> bytes:
    return value if isinstance(value, bytes) else reply_text(value).encode()


def _score(value: Reply) -> float:
    try:
        return float(reply_text(value))
    except ValueError:
        return 0.0


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
