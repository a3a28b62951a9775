"""The simulation finds defects planted in the protocol's scripts, within a bounded number of
schedules: a simulation that passes could be one that looks at nothing, and these say it does
not. Each plant is a small edit of the scripts' twins (tests/sim/scripts.py), the kind of slip
a change to the scripts could make; the bound is what the simulation needs for it, with room.
"""

from __future__ import annotations

import pytest
import redis

from tests.sim.run import shortest_failing_prefix, simulate
from tests.sim.scripts import Plant
from tests.sim.world import ROLLBACKS, Knobs

pytestmark = pytest.mark.integration

STEPS = 400

#: (plant, how many schedules from seed 0 may pass before it must be found, the knobs)
PLANTS: list[tuple[Plant, int, Knobs | None]] = [
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
        # a take that does not judge the receiver's stamp: a rollback behind its last take is
        # not seen before the take hands out what the rollback brought back (found at seed 15)
        Plant(
            "take ignores its stamp",
            (("if known > 0 and held < known then", "if false then"),),
        ),
        20,
        ROLLBACKS,
    ),
]


@pytest.mark.parametrize(
    ("plant", "bound", "knobs"), PLANTS, ids=[plant.name for plant, _, _ in PLANTS]
)
def test_the_simulation_finds_a_planted_defect(
    sim_redis: redis.Redis, plant: Plant, bound: int, knobs: Knobs | None
) -> None:
    # Given the scripts with a defect planted in them
    # When the simulation runs its schedules from seed 0, at most `bound` of them
    for seed in range(bound):
        _world, problems = simulate(sim_redis, seed, STEPS, plant=plant, knobs=knobs)
        if problems:
            break
    else:
        pytest.fail(f"{plant.name!r}: nothing broke in {bound} schedules")
    # Then a schedule breaks a guarantee, and its shortest failing prefix found breaks it too
    steps, _world, shortest = shortest_failing_prefix(
        sim_redis, seed, STEPS, plant=plant, knobs=knobs
    )
    assert shortest and steps <= STEPS
    print(f"{plant.name}: seed {seed}, {steps} steps: {problems[0][:200]}")
