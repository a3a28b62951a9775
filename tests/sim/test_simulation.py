"""The protocol under the deterministic simulation (tests/sim/world.py): fixed seeds in CI, each
a schedule of a few hundred steps with faults, then settled and checked (tests/sim/checks.py);
and the first of them again heavy with rollbacks of Redis to an earlier snapshot.

    pytest tests/sim                               # the CI seeds
    pytest tests/sim --sim-seed 23 --sim-schedules 1    # replay one seed
    pytest tests/sim --sim-seed 1000 --sim-schedules 500  # hunt further

A seed that breaks something prints what broke, and the last steps of the shortest prefix of its
schedule found to break too; the same seed gives the same run again.
"""

from __future__ import annotations

import pytest
import redis

from tests.sim.run import shortest_failing_prefix, simulate
from tests.sim.world import ROLLBACKS, Knobs

pytestmark = pytest.mark.integration

#: The seeds CI runs, and the steps of each schedule (about 1-2 s per seed here).
CI_SEEDS = 40
#: How many schedules heavy with rollbacks (world.ROLLBACKS) CI runs: seeds 0-9, each, when it
#: draws no rollback, replaced by the first of seed + 1000, + 2000, ... that does.
CI_ROLLBACK_SEEDS = 10
STEPS = 400


def _seeds(config: pytest.Config) -> list[int]:
    first = config.getoption("--sim-seed")
    count = config.getoption("--sim-schedules")
    start = 0 if first is None else first
    return list(range(start, start + (count or (1 if first is not None else CI_SEEDS))))


def _named(config: pytest.Config) -> bool:
    """Whether the seeds were named on the command line."""
    return any(config.getoption(name) is not None for name in ("--sim-seed", "--sim-schedules"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "seed" in metafunc.fixturenames:
        metafunc.parametrize("seed", _seeds(metafunc.config))
    if "rollback_seed" in metafunc.fixturenames:
        seeds = _seeds(metafunc.config)
        chosen = _named(metafunc.config)
        metafunc.parametrize("rollback_seed", seeds if chosen else seeds[:CI_ROLLBACK_SEEDS])


def _judge(
    client: redis.Redis, seed: int, knobs: Knobs | None = None, *, draw_rollback: bool = False
) -> None:
    world, problems = simulate(client, seed, STEPS, knobs=knobs)
    # (a schedule heavy with rollbacks that drew none would check nothing of them: in CI the
    # next of its series that draws one runs instead; a seed named on the command line runs
    # as named)
    for later in range(seed + 1000, seed + 10_000, 1000):
        if not draw_rollback or world.rollbacks:
            break
        seed = later
        world, problems = simulate(client, seed, STEPS, knobs=knobs)
    if problems:
        steps, shortest, _ = shortest_failing_prefix(client, seed, STEPS, knobs=knobs)
        pytest.fail(
            f"seed {seed} ({world.steps} steps, {len(world.calls)} calls):\n"
            + "\n".join(problems[:10])
            + f"\n-- the shortest failing prefix found: {steps} steps (--sim-seed {seed}); "
            + "its last steps:\n"
            + "\n".join(shortest.log[-60:])
        )
    assert world.calls  # (a schedule that made no call would check nothing)
    if knobs is not None and knobs.rollback:
        assert world.rollbacks  # (nor would one heavy with rollbacks that made none)


def test_a_schedule_breaks_no_guarantee(sim_redis: redis.Redis, seed: int) -> None:
    _judge(sim_redis, seed)


def test_a_schedule_heavy_with_rollbacks_breaks_no_guarantee(
    sim_redis: redis.Redis, rollback_seed: int, pytestconfig: pytest.Config
) -> None:
    _judge(sim_redis, rollback_seed, ROLLBACKS, draw_rollback=not _named(pytestconfig))


def test_a_seed_replays_the_same_run(sim_redis: redis.Redis) -> None:
    # Given a seed run once
    first, _ = simulate(sim_redis, 7, STEPS)
    # When it runs again
    again, _ = simulate(sim_redis, 7, STEPS)
    # Then every step is the same (the world's log names each step, its time and its task)
    assert first.log == again.log
    assert len(first.log) > STEPS // 2


# (found by an unchosen hunt, 1 of 150 schedules: a producer's lane made between two refreshes
# of its level got the queue's TTL, and requests with a longer window pushed to it later
# outlived it, lost from the queue; _queue.lua now gives such a lane its level's expiry)
def test_seed_30519_breaks_no_guarantee(sim_redis: redis.Redis) -> None:
    _judge(sim_redis, 30519)
