"""The simulation finds defects planted in the protocol, within a bounded number of schedules:
a simulation that passes could be one that looks at nothing, and these say it does not. Each
plant is a small edit of the scripts' twins or of a method of the simulated node
(tests/sim/scripts.py), the kind of slip a change could make; the bound is what the simulation
needs for it, with room. Three of them put back, each alone, the races the simulation was built
to find (docs/design.md, "What it found"): a skipped id counted out of its level twice, a take
that returns while its node closes, and a dequeue cut short after its take.
"""

from __future__ import annotations

import pytest
import redis

from tests.sim.plants import PLANTS
from tests.sim.run import shortest_failing_prefix, simulate
from tests.sim.scripts import Plant
from tests.sim.world import Knobs

pytestmark = pytest.mark.integration

STEPS = 400


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
