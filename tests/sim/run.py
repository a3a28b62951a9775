"""One simulation run of a seed, on a Redis the caller owns (it is flushed first)."""

from __future__ import annotations

import logging
import traceback

import redis

from tests.sim.checks import history_violations
from tests.sim.clock import SimClock, seeded_randomness, virtual_time
from tests.sim.scripts import Plant
from tests.sim.world import Broken, Knobs, World

__all__ = ["shortest_failing_prefix", "simulate"]


def simulate(
    client: redis.Redis,
    seed: int,
    steps: int,
    *,
    strict: bool = True,
    plant: Plant | None = None,
    knobs: Knobs | None = None,
) -> tuple[World, list[str]]:
    """Run `seed` for `steps` steps and settle; the world and what broke (empty: nothing).
    `plant`: a defect planted in the scripts (tests/sim/scripts.py); `knobs`: how often each
    thing happens (tests/sim/world.py's defaults)."""
    client.flushall()
    client.script_flush()
    quiet = logging.getLogger("prq")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # (a run's warnings are its ordinary life: losses, ...)
    clock = SimClock()
    with seeded_randomness(seed), virtual_time(clock):
        world = World(client, seed, plant=plant, clock=clock, knobs=knobs)
        world.strict = strict
        try:
            world.run(steps)
            problems = history_violations(world)
        except Broken as exc:
            problems = exc.problems
        except Exception:  # a flow or the world itself failed: that is a finding too
            problems = ["raised: " + traceback.format_exc()]
        finally:
            quiet.setLevel(level)
            world.close()
    return world, problems


def shortest_failing_prefix(
    client: redis.Redis,
    seed: int,
    steps: int,
    *,
    strict: bool = True,
    plant: Plant | None = None,
    knobs: Knobs | None = None,
) -> tuple[int, World, list[str]]:
    """The fewest steps of `seed`'s schedule that, run and then settled, still break a
    guarantee, found by bisection over the prefix's length; with that run's world and what it
    broke. `steps` must break something. Runs are deterministic, so a prefix is the same first
    steps: a break seen after step k is seen by every prefix of k steps or more; one judged only
    at the end may come and go with the length, so this is the shortest found, not always the
    shortest there is."""
    world, problems = simulate(client, seed, steps, strict=strict, plant=plant, knobs=knobs)
    if not problems:
        raise ValueError(f"seed {seed} breaks nothing in {steps} steps")
    best, passing = (steps, world, problems), 0
    failing = steps
    while failing - passing > 1:
        middle = (passing + failing) // 2
        world, problems = simulate(client, seed, middle, strict=strict, plant=plant, knobs=knobs)
        if problems:
            failing, best = middle, (middle, world, problems)
        else:
            passing = middle
    return best
