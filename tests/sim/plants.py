"""Defects planted in the protocol, each with how many schedules from seed 0 the simulation may
need to find it (tests/sim/test_planted.py; `python -m tests.sim.hunt --plant NAME` measures
one). A plant is a small edit of the scripts' twins or of a method of the simulated node
(tests/sim/scripts.py), the kind of slip a change could make. Three of them put back, each
alone, the races the simulation was built to find (docs/design.md, "What it found")."""

from __future__ import annotations

import dataclasses

from tests.sim.scripts import Plant
from tests.sim.world import ROLLBACKS, Knobs

__all__ = ["PLANTS", "plant_named"]

#: Rollback-heavy schedules with rollbacks twice as likely again, and none of what the stamp
#: has nothing to do with (sends, bulk writers, handlers that take time, the quiet steps): the
#: stamp's plant needs a take between a snapshot and its rollback, then another after it
#: (2026-12-07: found at seed 21; with those operations too, at seed 93; at seed 6 before they
#: came; with ROLLBACKS itself not in 54 schedules once one-way messages came).
STAMP_HUNT = dataclasses.replace(
    ROLLBACKS,
    rollback=0.8,
    send=0,
    withdraw=0,
    bulk=0,
    outcomes=0,
    quiet_steps=0,
    handler_s=(0.0,),
)

#: Schedules where an enqueue's reply is often lost and Redis often flushed, receivers take
#: eagerly and nothing else cuts a call short (no cancels, closes, crashes, restarts or links
#: giving up): the enqueue's plant needs its first attempt taken and run, a flush, and then its
#: retry (2026-12-08: found at seed 5; with the ordinary knobs not in 200 schedules, with
#: flushes and lost replies alone raised not in 150).
REPLAY_HUNT = dataclasses.replace(
    Knobs(),
    flush=1.0,
    lose_reply=4.0,
    arrive=3.0,
    dequeue=8.0,
    cancel_task=0,
    cancel_call=0,
    give_up=0,
    close=0,
    crash=0,
    restart=0,
)

#: Bounds for the three races of docs/design.md ("What it found"): each is found at a seed
#: below its bound (2026-12-07, with sends, withdraws, bulk writers, handlers that take time
#: and the quiet steps: seeds 3, 2 and 4; 2026-12-03: 1, 29 and 6), with room for changes to
#: the schedules.
BOUND_SKIPPED = 10
BOUND_CLOSING = 60
BOUND_CUT_SHORT = 25

#: (plant, how many schedules from seed 0 may pass before it must be found, the knobs)
PLANTS: list[tuple[Plant, int, Knobs | None]] = [
    (
        # a take that skips an id past its pickup deadline and leaves its record "queued": a
        # later withdraw or cancel takes it out of its level a second time, the level's depth
        # runs out while live ids wait in its lanes, and those are never handed out
        Plant(
            "a skipped id stays queued",
            (("if st == 'queued' then\n      -- popped,", "if false then\n      -- popped,"),),
        ),
        BOUND_SKIPPED,
        None,
    ),
    (
        # a take whose reply comes while its node closes (its token given back by the close,
        # the request with it, for another receiver) is run all the same
        Plant(
            "a take that returns while its node closes runs",
            code=(
                ("_receive_flow", "if token not in self._taking:", "if False:"),
                (
                    "_receive_flow",
                    "if self._taking.pop(token, None) is None:",
                    "if self._taking.pop(token, None) is None and False:",
                ),
            ),
        ),
        BOUND_CLOSING,
        None,
    ),
    (
        # a dequeue cut short (a cancel, an error) after its take returned, in the steps that
        # sort what it took, gives nothing back: what it adopted is beaten for and never run,
        # the rest stays taken by nobody
        Plant(
            "a dequeue cut short after its take gives nothing back",
            code=(
                (
                    "_receive_flow",
                    "            try:\n                good = yield from self._sort_taken(",
                    "            current.clear()\n"
                    "            try:\n                good = yield from self._sort_taken(",
                ),
                (
                    "_receive_flow",
                    "            except BaseException:\n"
                    "                self._let_go(endpoint, token, result.items)\n"
                    "                raise\n",
                    "            finally:\n                pass\n",
                ),
            ),
        ),
        BOUND_CUT_SHORT,
        None,
    ),
    (
        # a take that pops no id (it reads the head of the lane instead): the id stays queued
        # in its lane after it was handed out, and blocks the lane behind it
        Plant(
            "take leaves the id in its lane",
            (
                ("local id = redis.call('LPOP', lane)", "local id = redis.call('LINDEX', lane, 0)"),
                (
                    "local ids = redis.call('LPOP', lane, k)",
                    "local ids = redis.call('LRANGE', lane, 0, k - 1)",
                ),
            ),
        ),
        5,
        None,
    ),
    (
        # a withdrawal (pickup deadline, call timeout, cancel before pickup) that leaves the id
        # in its level: the level's depth counts a request that no longer waits
        Plant(
            "withdraw and cancel leave the id in its level",
            (
                (
                    "    queue_remove(KEYS[2], KEYS[3], pri or '0', ARGV[5])",
                    "    -- (planted: the id stays in its level)",
                ),
                (
                    "    queue_remove(KEYS[3], KEYS[4], pri or '0', ARGV[4])",
                    "    -- (planted: the id stays in its level)",
                ),
            ),
        ),
        10,
        None,
    ),
    (
        # a send whose outcome fires its callback after withdraw() said it was withdrawn (a
        # close, a loss or an expiry came before its call saw the withdrawal: found so,
        # 2026-12-07, at seeds 9 and 10 of the ordinary schedules, in prq's own claim; the
        # plant at seed 4)
        Plant(
            "a withdrawn send still fires its callback",
            code=(("SendState.claim", "if self.fired or self.withdrawn:", "if self.fired:"),),
        ),
        20,
        None,
    ),
    (
        # a receiver that does not beat for what it takes: its callers declare it lost while
        # it runs their requests (the liveness rule of checks.py; found at seed 1)
        Plant(
            "a receiver that does not beat for what it took",
            code=(("_adopt", "self._watch.hold(pending, now, item.sequence)", "pass"),),
        ),
        10,
        None,
    ),
    (
        # a take that does not judge the receiver's stamp: a rollback behind its last take is
        # not seen before the take hands out what the rollback brought back (found at seed 21)
        Plant(
            "take ignores its stamp",
            (("if known > 0 and held < known then", "if false then"),),
        ),
        35,
        STAMP_HUNT,
    ),
    (
        # an enqueue that does not judge its node's stamp: sent again after a flush (its first
        # reply lost, its request taken and run before the loss), it queues the request
        # afresh, numbered after the loss, and it runs twice
        Plant(
            "enqueue ignores its stamp",
            (("if known_stamp > 0 and stamp.held < known_stamp then", "if false then"),),
        ),
        30,
        REPLAY_HUNT,
    ),
]


def plant_named(name: str) -> tuple[Plant, int, Knobs | None]:
    """The plant of that name, its bound and its knobs."""
    for entry in PLANTS:
        if entry[0].name == name:
            return entry
    raise KeyError(f"no plant {name!r}; there are: {[p.name for p, _, _ in PLANTS]}")
