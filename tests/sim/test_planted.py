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

from tests.sim.plants import PLANTS, plant_named
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
    # Given the protocol with a defect planted in it
    # When the simulation runs its schedules from seed 0, at most `bound` of them
    for seed in range(bound):
        _world, problems = simulate(sim_redis, seed, STEPS, plant=plant, knobs=knobs)
        if problems:
            break
    else:
        pytest.fail(f"{plant.name!r}: nothing broke in {bound} schedules")
    # Then a schedule breaks a guarantee
    print(f"{plant.name}: seed {seed} ({seed + 1} schedules): {problems[0][:200]}")


def test_a_failing_seed_is_shrunk_to_a_shorter_prefix_that_fails_too(
    sim_redis: redis.Redis,
) -> None:
    # Given a plant and the first seed that breaks with it (within its bound: see PLANTS)
    plant, bound, knobs = plant_named("take leaves the id in its lane")
    seed = next(
        (s for s in range(bound) if simulate(sim_redis, s, STEPS, plant=plant, knobs=knobs)[1]),
        None,
    )
    assert seed is not None
    # When its schedule is shrunk
    steps, world, shortest = shortest_failing_prefix(
        sim_redis, seed, STEPS, plant=plant, knobs=knobs
    )
    # Then the prefix found is shorter, and breaks a guarantee too; one step fewer does not
    assert shortest and steps < STEPS
    assert world.steps >= steps
    _world, fewer = simulate(sim_redis, seed, steps - 1, plant=plant, knobs=knobs)
    assert not fewer, f"{steps - 1} steps break too: {fewer[:1]}"
