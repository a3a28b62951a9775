"""Many steps in one script call: enqueue calls to one endpoint merged into one enqueue call,
answers to one endpoint into one apply_response call, and each caller's reply spread back from
the merged reply. The I/O layer (prq.transport) merges every batch it sends with merge_calls."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Final

from prq.protocol.effects import Call, Reply
from prq.protocol.scripts.answer import ANSWER_ARGS, ANSWER_HEAD
from prq.protocol.scripts.enqueue import ENQUEUE_ARGS, ENQUEUE_KEYS
from prq.protocol.scripts.loading import APPLY_RESPONSE, ENQUEUE

__all__ = [
    "MAX_MERGED_ANSWERS",
    "MAX_MERGED_ENQUEUES",
    "merge_answers",
    "merge_calls",
    "merge_enqueues",
]


#: Most requests one merged enqueue call carries (merge_enqueues).
MAX_MERGED_ENQUEUES: Final = 64
#: Most answers one merged apply_response call carries (merge_answers).
MAX_MERGED_ANSWERS: Final = 256


def merge_calls(calls: Sequence[Call]) -> tuple[list[Call], Callable[[list[Reply]], list[Reply]]]:
    """merge_answers, then merge_enqueues: the calls to send for `calls`, and the function that
    turns their replies back into one per call of `calls`."""
    answered, spread_answers = merge_answers(calls)
    sent, spread_enqueues = merge_enqueues(answered)
    return sent, lambda replies: spread_answers(spread_enqueues(replies))


def _enqueues(call: Call) -> int:
    return (len(call.args) - 3 - int(call.args[2])) // ENQUEUE_ARGS


#: Where an enqueue call's keys stand in its args: its record's, the endpoint's shared by a
#: merged call's requests, and its sender stamp's (enqueue.lua: KEYS[1], KEYS[2..12], KEYS[13]).
_RECORD = 3
_SHARED = slice(4, 3 + ENQUEUE_KEYS - 1)
_STAMP = 3 + ENQUEUE_KEYS - 1


def merge_enqueues(
    calls: Sequence[Call],
) -> tuple[list[Call], Callable[[list[Reply]], list[Reply]]]:
    """Merge the enqueue calls of `calls` for one endpoint into one call each (at most
    MAX_MERGED_ENQUEUES requests), where the first of them stood: Redis then runs one script
    for many requests, judged in order as if each came alone (enqueue.lua), and shares what
    they read alike (the limits, the clock, the parks, the pulse); each request brings its
    record's key and its sender stamp's (most often the same for all). Returns the calls to send
    and the function that turns their replies back into one reply per call of `calls` (a
    merged call's error reply goes to each call it merged). As in merge_answers, the calls
    are independent steps, so a request may go earlier than a call queued before it."""
    if sum(1 for call in calls if call.script is ENQUEUE) < 2:
        return list(calls), _same
    sent: list[Call] = []
    carries: list[list[int]] = []
    #: For each merged call (by its place in `sent`): its requests' keys and values so far.
    keys_of: dict[int, list[str | int | bytes]] = {}
    args_of: dict[int, list[str | int | bytes]] = {}
    open_for: dict[tuple[object, ...], int] = {}  # the endpoint's keys -> the call to join
    for i, call in enumerate(calls):
        if call.script is ENQUEUE and _enqueues(call) == 1:
            shared = call.args[_SHARED]
            at = open_for.get(shared)
            if at is not None and len(carries[at]) < MAX_MERGED_ENQUEUES:
                keys_of[at] += (call.args[_RECORD], call.args[_STAMP])
                args_of[at].extend(call.args[3 + ENQUEUE_KEYS :])
                carries[at].append(i)
                continue
            open_for[shared] = len(sent)
            keys_of[len(sent)], args_of[len(sent)] = [], []
        sent.append(call)
        carries.append([i])
    for at, more_keys in keys_of.items():
        if more_keys:
            first = sent[at].args
            keys = (*first[3 : 3 + ENQUEUE_KEYS], *more_keys)
            values = (*first[3 + ENQUEUE_KEYS :], *args_of[at])
            sent[at] = Call(("EVALSHA", first[1], len(keys), *keys, *values), ENQUEUE)
    return sent, partial(_spread_enqueues, len(calls), carries)


def _spread_enqueues(count: int, carries: list[list[int]], replies: list[Reply]) -> list[Reply]:
    """One reply per call merged (see merge_enqueues): a merged call answers a list of them."""
    out: list[Reply] = [None] * count
    for members, reply in zip(carries, replies, strict=True):
        if len(members) == 1:
            out[members[0]] = reply
        elif isinstance(reply, list) and len(reply) == len(members):
            for member, one in zip(members, reply, strict=True):
                out[member] = one
        else:  # an error reply (or one not shaped as merged): each merged call gets it
            for member in members:
                out[member] = reply
    return out


def _answers(call: Call) -> int:
    return (len(call.args) - ANSWER_HEAD) // ANSWER_ARGS


def merge_answers(calls: Sequence[Call]) -> tuple[list[Call], Callable[[list[Reply]], list[Reply]]]:
    """Merge the apply_response calls of `calls` that answer on one endpoint into one call each
    (at most MAX_MERGED_ANSWERS answers), where the first of them stood: Redis then runs one
    script for many answers, not one per answer. Returns the calls to send and the function
    that turns their replies back into one reply per call of `calls` (a merged call's error
    reply goes to each call it merged). Calls are independent steps (the I/O layer's batches),
    so an answer may go earlier than a call queued before it; nothing else moves."""
    if sum(1 for call in calls if call.script is APPLY_RESPONSE) < 2:
        return list(calls), _same
    sent: list[Call] = []
    #: For each call sent: the indexes of `calls` it carries (one, unless merged).
    carries: list[list[int]] = []
    #: For each answer call sent (by its place in `sent`): the answers it holds, and the
    #: arguments of the answers merged into it.
    held: dict[int, int] = {}
    more: dict[int, list[str | int | bytes]] = {}
    open_for: dict[tuple[object, ...], int] = {}  # shared head -> the call answers join
    for i, call in enumerate(calls):
        if call.script is APPLY_RESPONSE:
            head, n = call.args[:ANSWER_HEAD], _answers(call)
            at = open_for.get(head)
            if at is not None and held[at] + n <= MAX_MERGED_ANSWERS:
                more[at].extend(call.args[ANSWER_HEAD:])
                held[at] += n
                carries[at].append(i)
                continue
            open_for[head] = len(sent)
            held[len(sent)], more[len(sent)] = n, []
        sent.append(call)
        carries.append([i])
    for at, args in more.items():
        if args:
            sent[at] = Call((*sent[at].args, *args), APPLY_RESPONSE)

    return sent, partial(_spread, calls, carries)


def _spread(calls: Sequence[Call], carries: list[list[int]], replies: list[Reply]) -> list[Reply]:
    """One reply per call of `calls`, from the replies of the calls sent for them (`carries`:
    which of `calls` each one sent carries; see merge_answers)."""
    out: list[Reply] = [None] * len(calls)
    for members, reply in zip(carries, replies, strict=True):
        if len(members) == 1:
            out[members[0]] = reply
        elif not isinstance(reply, list):  # an error reply: each merged call gets it
            for member in members:
                out[member] = reply
        else:
            at = 0
            for member in members:
                n = _answers(calls[member])
                out[member] = reply[at : at + n]
                at += n
    return out


def _same(replies: list[Reply]) -> list[Reply]:
    return replies
