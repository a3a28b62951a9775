"""What a simulation run must never show.

After every step, the queue's structure (read straight from Redis, independently of prq):
- a level's depth `n` is the number of ids its lanes hold that are not in its removed set
  (and of the ids of a lane of it that expired, their records expired before: they count
  until the level is forgotten, a limit of the accounting, docs/design.md);
- every record that says `queued` sits in a lane of its level and is not marked removed (so a
  take will find it), and every record a lane holds that is not removed says `queued` (or is
  gone: a record that expired waits in its lane for a take to drop it);
- a taken record names its owner token and receiver; a handed one an owner token whose take
  was not withdrawn (nothing is handed to a park after it was taken back);
- a record taken by a live receiver that is not closing is in the hands of one of its tasks:
  a take still under way (sorting what it got), one being given back, a spare token (the next
  take collects what it got), or an answer under way; one it forgot is never run, and its
  caller is at last told "receiver lost" of a request that never ran. (One its handler got is
  let go when its answer cannot be written: its caller is told it may have run, which it did.
  Records a rollback brought back are not judged: their tokens belong to takes ended since.)

At the end of a run (every call ended, every task but the receivers' polls done), the history:
- an at_most_once request ran at most once (counting every node whose handler got it), but
  where a rollback brought it back as it was before its run and the receiver that ran it again
  could not tell: it had been handed no take between the snapshot and the rollback (its
  stamp, prq:{e}:ts:<node>, shows only a rollback behind its own last take: design.md, "Limits"),
  or that take was more than the stamp's trust (half a list TTL) before; or where its enqueue
  was sent again after a flush or a restart (its first reply lost) and queued it afresh, which
  no node can tell from a first enqueue (design.md, "Limits");
- a request whose caller was told it never ran (an error with `maybe_executed` false) never ran,
  before or after the caller was told, but where a rollback brought it back as it was before
  that run, before the caller was told (a node does not know a loss it has not seen yet), or
  brought it back queued after the caller was told, and a receiver started after the rollback
  ran it (a node started after a rollback runs its ghosts);
- a call answered `ok` got its own request's answer (the echo of its params) and its request
  ran; a one-way message (notify) is held to the same rules but for the answer (it may also
  expire unrun: its sender was told only that it was queued);
- a status read fails only for a record whose body the world overwrote;
- every call ended (nothing hung), and no live node still holds a request (one held and never
  answered would be beaten for as long as the node lives);
- no caller got DataLoss before Redis ever lost data;
- every key of the run has a TTL.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import redis

from prq.core.errors import (
    CancelledAfterPickup,
    DataLoss,
    PickupTimeout,
    PrqError,
    ReceiverLost,
)
from prq.core.keys import EndpointKeys
from prq.node.data_loss.counters import STAMP_TRUST_SHARE
from tests.sim.clock import CLOCK_KEY
from tests.sim.world import CallerCrashed, CallRecord, SimNode, World

__all__ = ["history_violations", "structure_violations"]


def _send(client: redis.Redis, *args: Any) -> Any:
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


#: What the checks read of a record: its type, and its state, owner token, receiver and take
#: time (a hash's fields; None for the one-string form)
Record = tuple[bytes, bytes | None, bytes | None, bytes | None, bytes | None]


def _records(client: redis.Redis, keys: list[bytes]) -> dict[bytes, Record]:
    """Each record key's type and fields, read in one round trip (the check runs after every
    step: a round trip per key made it the simulation's main cost)."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.type(key)
        pipe.hmget(key, "st", "own", "rcv", "tk")
    replies = pipe.execute(raise_on_error=False)
    found: dict[bytes, Record] = {}
    for key, kind, fields in zip(keys, replies[::2], replies[1::2], strict=True):
        kind = kind if isinstance(kind, bytes) else str(kind).encode()
        if kind == b"hash":
            found[key] = (kind, *fields)
        else:
            found[key] = (kind, None, None, None, None)
    return found


def _state(record: Record | None) -> str | None:
    if record is None:
        return None
    kind, state = record[0], record[1]
    if kind == b"hash":
        return state.decode() if state else "?"
    if kind == b"string":  # (a queued record in its one-string form)
        return "queued"
    return None


def structure_violations(world: World, *, strict: bool = True) -> list[str]:
    """The queue's structure, as above; one line per break. Not `strict`: only what stops a
    queue handing out work (a depth that is not what its lanes hold, a level not listed that
    holds live ids), not a record's state that disagrees with where it sits."""
    client = world.client
    keys: EndpointKeys = world.nodes[0].keys.endpoint(world.endpoint)
    problems: list[str] = []
    in_lanes: dict[bytes, str] = {}
    removed_all: set[bytes] = set()
    levels = {p.decode() for p in _send(client, "ZRANGE", keys.levels, 0, -1)}
    prefix = keys.level_prefix
    level_names = {
        k.decode()[len(prefix) :].split(":")[0] for k in _send(client, "KEYS", prefix + "*")
    }
    if world.lanes_seen_at != world.losses:  # (Redis lost its data: what was seen went)
        world.lanes_seen.clear()
        world.expired_counted.clear()
        world.lanes_seen_at = world.losses
    for p in sorted(levels | level_names):
        live, removed, found = _level(world, keys, p, p in levels)
        problems += found
        removed_all |= removed
        for i in live:
            in_lanes[i] = p
    records = _send(client, "KEYS", keys.request("*"))
    base = len(keys.request(""))
    read = _records(client, records)
    for key in records:
        request_id = key[base:]
        state = _state(read[key])
        if strict and state == "queued" and request_id not in in_lanes:
            problems.append(f"{request_id.decode()} says queued, but no lane lists it")
    for request_id in in_lanes if strict else ():
        state = _state(read.get(keys.request(request_id.decode()).encode()))
        if state not in (None, "queued"):
            problems.append(f"{request_id.decode()} sits in a lane, but says {state}")
    problems += _owners(world, keys, read, base)
    return problems


def _level(
    world: World, keys: EndpointKeys, p: str, listed: bool
) -> tuple[list[bytes], set[bytes], list[str]]:
    """Level `p`'s live ids (in its lanes, not removed), its removed set, and what breaks."""
    client = world.client
    problems: list[str] = []
    depth = int(_send(client, "HGET", keys.level(p), "n") or 0)
    removed = set(_send(client, "SMEMBERS", keys.level_removed(p)))
    if not listed or depth == 0:
        world.expired_counted.pop(p, None)
    ids: list[bytes] = []
    for member in _send(client, "ZRANGE", keys.level_lanes(p), 0, -1):
        lane = keys.level_lane(p, member.decode())
        held = _send(client, "LRANGE", lane, 0, -1)
        if not held and not _send(client, "EXISTS", lane):
            _lane_expired(world, keys, p, world.lanes_seen.pop((p, member), []), removed)
        elif held:
            world.lanes_seen[p, member] = held
        ids += held
    live = [i for i in ids if i not in removed]
    counted = world.expired_counted.get(p, set()) - set(live)
    if listed and depth != len(live) + len(counted):
        problems.append(
            f"level {p}: depth {depth}, but its lanes hold {len(live)} live ids"
            + (f" (and {len(counted)} of a lane that expired)" if counted else "")
        )
    if not listed and live:
        problems.append(f"level {p} is not listed, but its lanes hold {len(live)} live ids")
    return live, removed, problems


def _lane_expired(
    world: World, keys: EndpointKeys, p: str, seen: list[bytes], removed: set[bytes]
) -> None:
    """A listed lane of level `p` expired: the ids it held when last seen whose records had
    expired too count in the level's depth until the level is forgotten (docs/design.md,
    "Limits" of the queue's accounting). One whose record lives is not excused: a live request
    lost with its lane is what the check is for."""
    dead = [
        i
        for i in seen
        if i not in removed and not _send(world.client, "EXISTS", keys.request(i.decode()))
    ]
    world.expired_counted.setdefault(p, set()).update(dead)


def _knows(world: World, node: SimNode, request_id: str, token: str) -> bool:
    """Whether `node` knows it owns the taken request (see the module docstring), as the
    world sees the node's tasks: not what the node's own books say, which is what is judged."""
    under_way = node.giving_back | {
        t for task in world.tasks if task.node is node and task.current for t in task.current
    }
    spare = any(token in tokens for tokens in node._spare_tokens.values())
    held = node._held.get(request_id)
    answering = held is not None and held.owner_token == token and request_id in node.answering
    return token in under_way or spare or answering


def _owners(world: World, keys: EndpointKeys, records: dict[bytes, Record], base: int) -> list[str]:
    """A taken request has an owner token and a receiver node, which knows it if it is live;
    a handed one an owner token whose take was not withdrawn (a withdrawn token's receipt
    holds the mark "!": nothing may be handed to it after that)."""
    client = world.client
    problems: list[str] = []
    receivers = {n.name: n for n in world.nodes if n.alive and not n._closing}
    for key, (kind, state, own, rcv, took) in records.items():
        if kind != b"hash":
            continue
        request_id = key[base:].decode()
        if state == b"taken" and not (own and rcv):
            problems.append(f"{request_id} is taken, but names no owner ({own!r}, {rcv!r})")
        node = receivers.get(rcv.decode()) if state == b"taken" and own and rcv else None
        if (
            node is not None
            and own is not None
            and int(took or 0) > world.rolled_back_ms
            and node.name not in world.runs.get(request_id, ())
            and not _knows(world, node, request_id, own.decode())
        ):
            problems.append(f"{request_id} is taken by {node.name}, which does not know it")
        if state == b"handed":
            if not own:
                problems.append(f"{request_id} is handed, but names no owner token")
            elif _send(client, "LINDEX", keys.take_receipt(own.decode()), 0) == b"!":
                problems.append(f"{request_id} is handed to token {own.decode()}, withdrawn")
    return problems


def keys_without_ttl(world: World) -> list[str]:
    client = world.client
    return [
        k.decode()
        for k in _send(client, "KEYS", "*")
        if k.decode() != CLOCK_KEY and _send(client, "PTTL", k) == -1
    ]


def _rolled_back_unseen(
    world: World, request_id: str, record: CallRecord, told_at: int | None = None
) -> bool:
    """Whether its caller was told it never ran only because of a rollback no node could see
    (design.md, "Limits"): one that brought the request back as it was before a run, before
    the caller was told; or one after the caller was told (after the snapshot) that brought it
    back queued to a receiver started after the rollback, which knows nothing of it."""
    runs = world.run_steps.get(request_id, [])
    started = {node.name: node.started_at for node in world.nodes}
    told = record.ended_at if told_at is None else told_at
    return any(
        snap < ran <= back < told or (snap < told and started[name] > back)
        for name, _, ran, _ in runs
        for snap, back in world.rollbacks
    )


def _blind(
    takes: list[tuple[int, int, float]],
    rollback: tuple[int, int],
    sent: int,
    at: float,
    trust_s: float,
) -> bool:
    """Whether a receiver with these take replies (the step each take ran, the step it was
    handed, the time then) could not tell of a rollback (snapshot step, rollback step) in its
    take sent at step `sent` and handing out at time `at`: none of its takes that ran between
    the two was handed to it before that take was sent (what it carries is what the node
    knew then), or none recently enough for its stamp to be sent."""
    snap, back = rollback
    return not any(
        snap < ran <= back and handed < sent and at - when < trust_s
        for ran, handed, when in takes
    )  # fmt: skip


def _ran_again(world: World, request_id: str) -> list[str]:
    """An at_most_once request's runs after its first that no rollback excuses (see the module
    docstring), as one problem; none if every one is excused."""
    runs = world.run_steps.get(request_id, [])
    trust_s = STAMP_TRUST_SHARE * world.settings.list_ttl_s
    nodes = {node.name: node for node in world.nodes}
    unexcused = [
        f"on {name} (taken at step {ran}, sent at {sent})"
        for (_, _, before, _), (name, sent, ran, at) in itertools.pairwise(runs)
        if not any(
            snap < before <= back < ran
            and _blind(nodes[name].takes, (snap, back), sent, at, trust_s)
            for snap, back in world.rollbacks
        )
    ]
    if not unexcused:
        return []
    first = runs[0]
    return [
        f"at_most_once {request_id} ran {len(runs)} times: first on {first[0]} (taken at step "
        f"{first[2]}), again " + ", ".join(unexcused)
    ]


def _send_violations(request_id: str, record: CallRecord) -> list[str]:
    """A send's callbacks (prq.facade.send): exactly one, with its outcome, unless the send
    was withdrawn (then none); a withdraw is judged as its caller being told "never ran"."""
    state = record.send
    assert state is not None and record.outcome is not None
    fired = record.callbacks
    if isinstance(record.outcome.error, CallerCrashed):
        return []  # (its node crashed: nothing runs a callback, nor a deferred one)
    if record.deferred is not None:
        return [f"send {request_id}: its outcome waited for a withdraw that never decided"]
    if state.withdrawn:
        return [f"send {request_id}: withdrawn, yet its callback got {fired}"] if fired else []
    error = record.outcome.error
    if error is not None and not isinstance(error, PrqError):
        return []  # (its task cancelled, or its node crashed: nothing runs a callback)
    if len(fired) != 1:
        return [f"send {request_id}: {len(fired)} callbacks ran ({fired}), not one"]
    expected = error if error is not None else record.outcome.response
    if fired[0] is not expected:
        return [f"send {request_id}: its callback got {fired[0]!r}, its outcome was {expected!r}"]
    return []


def _read_violations(world: World, request_id: str, record: CallRecord) -> list[str]:
    """What the reads of a bulk request's outcome told, against what happened: "never ran"
    only of one that never ran (then or later), an ok answer of one that ran with its own
    params, DataLoss only once Redis lost data."""
    problems: list[str] = []
    runs = world.runs.get(request_id, [])
    for outcome, step, losses in record.reads:
        error, response = outcome.error, outcome.response
        if isinstance(error, DataLoss) and losses == 0:
            problems.append(f"{request_id}: its outcome read DataLoss, but Redis never lost data")
        never_ran = error is not None and not getattr(error, "maybe_executed", True)
        if never_ran and runs and not _rolled_back_unseen(world, request_id, record, step):
            problems.append(
                f"{request_id}: its outcome read {type(error).__name__} (never ran) at "
                f"step {step}, but it ran on {runs}"
            )
        if response is not None and response.error is None:
            if not runs:
                problems.append(f"{request_id}: its outcome read ok at step {step}, never ran")
            elif response.result != record.request.params:
                problems.append(
                    f"{request_id}: its outcome read {response.result!r}, its params were "
                    f"{record.request.params!r}"
                )
    return problems


def _liveness_violations(world: World, request_id: str, record: CallRecord) -> list[str]:
    """A caller told its receiver was lost (ReceiverLost) or that it was itself (sender_lost)
    while both were up, with no fault in the window that verdict judges (the longer timeout,
    a beat interval and a poll before it, and for a receiver not before its take: no jump,
    no step lost, no close, crash or loss of Redis): a live node declared dead."""
    error = record.outcome.error if record.outcome is not None else None
    runs = world.run_steps.get(request_id, [])
    if not runs or record.ended_at < 0:
        return []  # (no verdict, or no receiver known to have held it)
    lost = isinstance(error, ReceiverLost) or (
        isinstance(error, CancelledAfterPickup) and "sender_lost" in str(error)
    )
    if not lost:
        return []
    settings = world.settings
    window = (
        max(settings.receiver_timeout_s, settings.sender_timeout_s)
        + settings.heartbeat_interval_s
        + settings.poll_interval_s
    )
    told = world.step_times[min(record.ended_at, len(world.step_times) - 1)]
    # (a receiver's lease begins at its take: a fault before that excuses no silence after it;
    # from when the take was sent, as it may have run on Redis at an earlier attempt than its
    # last, its replies lost meanwhile)
    since = told - window
    if isinstance(error, ReceiverLost):
        since = max(since, world.step_times[min(runs[-1][1], len(world.step_times) - 1)])
    if any(since <= t <= told for t in world.fault_times):
        return []
    alive = {node.name: node.alive and not node.closed for node in world.nodes}
    holder = runs[-1][0]
    if not alive.get(record.node) or not alive.get(holder):
        return []
    return [
        f"{request_id}: its caller {record.node} was told {type(error).__name__} ({error}) at "
        f"t={told:.3f} while it and its receiver {holder} were up, with no fault for {window} s"
    ]


def _pickup_violations(world: World, request_id: str, record: CallRecord) -> list[str]:
    """A caller told PickupTimeout before its window passed (its request withdrawn early), or
    told it well after (past the window, a poll and a second), with nothing in between that
    kept it from being heard on time (a fault, as for the liveness rule)."""
    error = record.outcome.error if record.outcome is not None else None
    if not isinstance(error, PickupTimeout) or record.started_t < 0 or record.ended_at < 0:
        return []
    told = world.step_times[min(record.ended_at, len(world.step_times) - 1)]
    deadline = record.started_t + record.pickup_s
    if told < deadline - 0.001:
        return [f"{request_id}: told PickupTimeout at t={told:.3f}, before its window ended"]
    if _told_late(world, deadline, told):
        return [
            f"{request_id}: told PickupTimeout at t={told:.3f}, its window ended at "
            f"{deadline:.3f}, with no fault between"
        ]
    return []


def _told_late(world: World, since: float, told: float) -> bool:
    """Told more than a poll and a second after `since`, with no fault between that kept the
    caller from being heard on time (a pulse lost costs a poll)."""
    late = since + world.settings.poll_interval_s + 1.0
    return told > late and not any(since <= t <= told for t in world.fault_times)


def _answer_violations(world: World, request_id: str, record: CallRecord) -> list[str]:
    """A call or a send told its outcome later than a poll and a second after its request's
    answer was accepted, with no fault between (its pulse lost, the poll reads the answer):
    a call that outlived its bound once it had its answer. (Before the answer a call waits as
    long as its receiver beats and it has no call timeout: the liveness rule judges that.)"""
    answered = world.answered_t.get(request_id)
    if answered is None or record.kind not in ("call", "send") or record.ended_at < 0:
        return []
    told = world.step_times[min(record.ended_at, len(world.step_times) - 1)]
    if _told_late(world, answered, told):
        return [
            f"{request_id}: its caller was told at t={told:.3f}, its answer was accepted at "
            f"t={answered:.3f}, with no fault between"
        ]
    return []


def _call_violations(world: World, request_id: str, record: CallRecord) -> list[str]:
    """What one call's (or one-way message's) history breaks."""
    problems: list[str] = []
    runs = world.runs.get(request_id, [])
    outcome = record.outcome
    if outcome is None:
        problems.append(f"call {request_id} never ended")
        return problems
    # (a message or a bulk request whose enqueue ran again after a loss, its first reply lost,
    # may run twice: the documented limit of enqueue_many.lua; a call's or a send's enqueue
    # carries its node's stamp, and a replay of it after a loss finds it low)
    sent_again = record.kind in ("notify", "bulk") and len(record.enqueue_eras) > 1
    if record.request.delivery == "at_most_once" and not sent_again:
        problems += _ran_again(world, request_id)
    if record.kind == "send":
        problems += _send_violations(request_id, record)
    problems += _read_violations(world, request_id, record)
    problems += _liveness_violations(world, request_id, record)
    problems += _pickup_violations(world, request_id, record)
    problems += _answer_violations(world, request_id, record)
    error = outcome.error
    if isinstance(error, DataLoss) and record.losses_at_end == 0:
        # (after a loss, a call made before its declaration may be refused: it is the
        # declaration, not the loss, that a node acts on)
        problems.append(f"{request_id}: its caller got DataLoss, but Redis never lost data")
    if error is not None:
        told_not_run = not isinstance(
            error, (asyncio.CancelledError, CallerCrashed)
        ) and not getattr(error, "maybe_executed", True)
        if told_not_run and runs and not _rolled_back_unseen(world, request_id, record):
            problems.append(
                f"{request_id}: its caller was told {type(error).__name__} (never ran), "
                f"but it ran on {runs}"
            )
        return problems
    if record.kind in ("notify", "bulk"):  # (told only that it is queued: it may run or expire)
        if request_id in world.corrupted and runs:
            problems.append(f"{request_id}: its body was not a request, yet it ran on {runs}")
        return problems
    response = outcome.response
    assert response is not None
    if response.error is None and not runs:
        problems.append(f"{request_id}: answered ok, but it never ran")
    if request_id in world.corrupted and runs:
        problems.append(f"{request_id}: its body was not a request, yet it ran on {runs}")
    if response.error is None and response.result != record.request.params:
        problems.append(
            f"{request_id}: answered {response.result!r}, its params were {record.request.params!r}"
        )
    return problems


def history_violations(world: World) -> list[str]:
    """The history, as above; one line per break."""
    problems: list[str] = []
    for request_id, record in world.calls.items():
        problems += _call_violations(world, request_id, record)
    for node in world.nodes:
        if node.alive and node._held:
            problems.append(f"node {node.name} still holds {sorted(node._held)} at the end")
    problems += [f"key {k} has no TTL" for k in keys_without_ttl(world)]
    problems += world.findings
    return problems
