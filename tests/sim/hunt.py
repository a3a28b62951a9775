"""Run seeds of the simulation until one breaks a guarantee (or the seeds run out): the tool
behind `--sim-seed`/`--sim-schedules` and the measurements in docs/design.md. A seed that
breaks is shrunk to the shortest prefix of its schedule found to break too.

    python -m tests.sim.hunt --first 0 --count 200 --steps 400 [--loose] [--log] [--rollbacks]
        [--plant NAME] [--knob name=value ...]

`--plant` runs with a defect of tests/sim/plants.py planted (how many schedules it takes to
find it); `--knob` sets a weight of world.Knobs for the run (to measure what a knob buys).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import redis

from prq.embedded import EmbeddedRedis
from tests.sim.plants import REPLAY_HUNT, plant_named
from tests.sim.run import shortest_failing_prefix, simulate
from tests.sim.world import ROLLBACKS, Knobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--loose", action="store_true", help="judge only harm to the queue")
    parser.add_argument(
        "--rollbacks", action="store_true", help="schedules heavy with rollbacks (ROLLBACKS)"
    )
    parser.add_argument(
        "--replays",
        action="store_true",
        help="schedules heavy with lost enqueue replies and flushes (plants.REPLAY_HUNT)",
    )
    parser.add_argument("--log", action="store_true", help="print the failing run's steps")
    parser.add_argument("--all", action="store_true", help="go on after a failure")
    parser.add_argument(
        "--no-shrink", action="store_true", help="do not look for the shortest failing prefix"
    )
    parser.add_argument("--plant", help="a plant's name (tests/sim/plants.py)")
    parser.add_argument("--knob", action="append", default=[], help="name=value (world.Knobs)")
    args = parser.parse_args()
    plant, knobs = None, ROLLBACKS if args.rollbacks else None
    if args.replays:
        knobs = REPLAY_HUNT
    if args.plant:
        plant, _bound, planted_knobs = plant_named(args.plant)
        knobs = knobs or planted_knobs
    if args.knob:
        changes = {
            name: int(value) if value.isdigit() else float(value)
            for name, value in (k.split("=", 1) for k in args.knob)
        }
        knobs = dataclasses.replace(knobs or Knobs(), **changes)  # type: ignore[arg-type]
    judge = {"strict": not args.loose, "knobs": knobs, "plant": plant}
    server = EmbeddedRedis().start()
    started = time.monotonic()
    try:
        client = redis.Redis.from_url(server.url)
        for n, seed in enumerate(range(args.first, args.first + args.count), 1):
            world, problems = simulate(client, seed, args.steps, **judge)  # type: ignore[arg-type]
            if problems:
                print(f"seed {seed} broke after {n} schedules, {time.monotonic() - started:.1f} s")
                for line in problems[:10]:
                    print("  " + line)
                if not args.no_shrink:
                    steps, world, problems = shortest_failing_prefix(
                        client,
                        seed,
                        args.steps,
                        **judge,  # type: ignore[arg-type]
                    )
                    print(f"  shortest failing prefix found: {steps} of {args.steps} steps")
                    for line in problems[:3]:
                        print("    " + line)
                if args.log:
                    print("\n".join(world.log[-80:]))
                if not args.all:
                    return
        print(
            f"{args.count} schedules from seed {args.first}: nothing broke "
            f"({time.monotonic() - started:.1f} s)"
        )
    finally:
        server.cleanup()


if __name__ == "__main__":
    main()
