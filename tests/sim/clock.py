"""The simulation's clock: one virtual time for the nodes and for Redis, moved only by the
scheduler.

The nodes read time through the `time` module each prq module imported; for a simulation run
`virtual_time` puts a stand-in there (its `monotonic`, `time`, `perf_counter` read the virtual
clock; everything else is the real module's). The scripts read the server's clock with `TIME`;
the simulation loads twins of them (tests/sim/scripts.py) that read the same virtual clock
from a key instead. Nothing of this is in prq: production code and scripts are what runs.

Randomness is the seed's too (`seeded_randomness`): the ids, tokens and nonces prq draws from
the OS, and its backoff jitter, come from a generator seeded by the run's seed, so that a seed
replays the same run (Redis orders sets and ties by the bytes of the names in them).

Key expiry follows Redis's own clock, which the simulation cannot stop or move: when virtual
time jumps, `EXPIRE_SCRIPT` shortens every TTL by the jump (and deletes what it ends, or leaves
within EXPIRY_FLOOR_MS of its end), and before each step it gives every TTL back the real time
that passed since the last step, so a key lives as long in virtual time as it would have in real
time, whatever the machine's speed, and a TTL a script reads (PTTL) is the same in every run.
"""

from __future__ import annotations

import base64
import contextlib
import os
import random
import secrets
import sys
import time as real_time
import types
import uuid
from collections.abc import Iterator

import prq.core.jitter
import prq.core.names

__all__ = [
    "CLOCK_KEY",
    "DUMP_SCRIPT",
    "EXPIRE_SCRIPT",
    "EXPIRY_FLOOR_MS",
    "SimClock",
    "seeded_randomness",
    "virtual_time",
]

#: Where every run's clocks start (fixed, so that a seed's run is the same run every time).
MONOTONIC_START = 1_000.0
WALL_START = 1_800_000_000.0

#: Where the scripts' twins read the virtual server clock: a hash of `s` and `us`, what TIME
#: answers (seconds, microseconds). A key no prq key is named like.
CLOCK_KEY = "sim:clock"

#: Shorten every key's TTL by ARGV[1] ms (a jump of virtual time), or lengthen it by as much when
#: negative (Redis's own clock moved that much while virtual time stood still); a key left with
#: ARGV[2] ms or less is deleted, so that none is left to expire by Redis's clock (the clock key
#: has no TTL).
EXPIRE_SCRIPT = """
local shift, floor = tonumber(ARGV[1]), tonumber(ARGV[2])
local gone = 0
for _, key in ipairs(redis.call('KEYS', '*')) do
  local ttl = redis.call('PTTL', key)
  if ttl > 0 then
    if ttl - shift <= floor then
      redis.call('DEL', key)
      gone = gone + 1
    else
      redis.call('PEXPIRE', key, ttl - shift)
    end
  end
end
return gone
"""

#: Every key but ARGV[1] (the clock), its DUMP and its PTTL, read in one script: (key, dump,
#: ttl, key, dump, ttl, ...), keys that have gone left out.
DUMP_SCRIPT = """
local out = {}
for _, key in ipairs(redis.call('KEYS', '*')) do
  if key ~= ARGV[1] then
    local dumped = redis.call('DUMP', key)
    local ttl = redis.call('PTTL', key)
    if dumped and ttl ~= -2 then
      out[#out + 1] = key
      out[#out + 1] = dumped
      out[#out + 1] = ttl
    end
  end
end
return out
"""

#: A jump deletes the keys it leaves this close to their end (ms): so that none is left to
#: expire by Redis's clock before the next step gives the time back (a key expires up to this
#: much early in virtual time, the same in every run).
EXPIRY_FLOOR_MS = 50


class SimClock:
    """Virtual seconds since the run began, shown as a monotonic and a wall clock that start
    at fixed points (the wall clock's in 2027, so creation times and sequence numbers look like
    real ones)."""

    def __init__(self) -> None:
        self.elapsed = 0.0
        self._mono0 = MONOTONIC_START
        self._wall0 = WALL_START

    def monotonic(self) -> float:
        return self._mono0 + self.elapsed

    def wall(self) -> float:
        return self._wall0 + self.elapsed

    def server_time(self) -> tuple[int, int]:
        """What TIME would answer: (seconds, microseconds)."""
        micros = round(self.wall() * 1_000_000)
        return micros // 1_000_000, micros % 1_000_000

    def advance(self, seconds: float) -> None:
        assert seconds >= 0
        self.elapsed += seconds


class _VirtualTime(types.ModuleType):
    """A stand-in for the `time` module that reads a SimClock."""

    def __init__(self, clock: SimClock) -> None:
        super().__init__("time")
        self._clock = clock

    def monotonic(self) -> float:
        return self._clock.monotonic()

    def perf_counter(self) -> float:
        return self._clock.monotonic()

    def time(self) -> float:
        return self._clock.wall()

    def monotonic_ns(self) -> int:
        return int(self._clock.monotonic() * 1e9)

    def time_ns(self) -> int:
        return int(self._clock.wall() * 1e9)

    def sleep(self, seconds: float) -> None:
        raise AssertionError("a simulated node slept: its waits must be effects")

    def __getattr__(self, name: str) -> object:
        return getattr(real_time, name)


@contextlib.contextmanager
def virtual_time(clock: SimClock) -> Iterator[None]:
    """Within the block, every prq module that imported `time` reads `clock` instead."""
    stand_in = _VirtualTime(clock)
    patched = [
        module
        for name, module in list(sys.modules.items())
        if (name == "prq" or name.startswith("prq.")) and getattr(module, "time", None) is real_time
    ]
    for module in patched:
        module.time = stand_in  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for module in patched:
            module.time = real_time  # type: ignore[attr-defined]


class _SeededOs(types.ModuleType):
    """A stand-in for `os` in prq.core.names: its urandom draws from the run's generator."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__("os")
        self._rng = rng

    def urandom(self, n: int) -> bytes:
        return self._rng.randbytes(n)

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)


@contextlib.contextmanager
def seeded_randomness(seed: int) -> Iterator[random.Random]:
    """Within the block, what prq draws at random (request ids: prq.core.names; node ids and
    nonces: uuid4; tokens: secrets; its backoff jitter) comes from one generator seeded by
    `seed`, which is yielded; nothing else draws from it, so each run of a seed draws the same.
    Only the simulation's thread may run meanwhile: the block replaces module attributes every
    thread sees."""
    rng = random.Random(seed ^ 0x5EED)
    saved = (uuid.uuid4, secrets.token_urlsafe, secrets.token_hex, secrets.randbelow)
    saved_jitter = prq.core.jitter._RANDOM

    def token_urlsafe(nbytes: int | None = None) -> str:
        raw = rng.randbytes(32 if nbytes is None else nbytes)
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    def token_hex(nbytes: int | None = None) -> str:
        return rng.randbytes(32 if nbytes is None else nbytes).hex()

    prq.core.names.os = _SeededOs(rng)  # type: ignore[attr-defined]
    uuid.uuid4 = lambda: uuid.UUID(bytes=rng.randbytes(16), version=4)
    secrets.token_urlsafe = token_urlsafe
    secrets.token_hex = token_hex
    secrets.randbelow = lambda exclusive_upper_bound: rng.randrange(exclusive_upper_bound)
    prq.core.jitter._RANDOM = random.Random(seed ^ 0x717E7)
    try:
        yield rng
    finally:
        prq.core.names.os = os  # type: ignore[attr-defined]
        uuid.uuid4, secrets.token_urlsafe, secrets.token_hex, secrets.randbelow = saved
        prq.core.jitter._RANDOM = saved_jitter
