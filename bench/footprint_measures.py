"""What bench/footprint.py writes and what one run of a variant measures: the variants' names,
the payloads, Redis's figures (Snapshot), this process's time (Clock), prq's bytes by kind of
key (Part) and one run's results (Measured).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from pydantic import JsonValue

#: Where the measured requests go.
ENDPOINT = "poll://footprint"

#: The variants, as the tables name them (see the module docstring).
LIST = "list, RPUSH 1,000/call"
KEYED = "key per request, SET PX NX 1,000/call"
SCRIPTED = "key per request from a script, 1,000/call"
BULK = "prq bulk, 1,000/call"
NOTIFY = "prq notify, one by one"
SEND = "prq send, one by one"


def params(i: int, size: int) -> dict[str, JsonValue]:
    """Params whose compact JSON is exactly `size` bytes, different for every i."""
    head = len('{"key":"0000000000","pad":""}')
    return {"key": f"{i:010d}", "pad": "x" * (size - head)}


def payload(i: int, size: int) -> bytes:
    """The list baseline's entry: the bytes prq's request carries as its params."""
    return json.dumps(params(i, size), separators=(",", ":")).encode()


# -- measuring -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What Redis holds: its data's bytes (clients' buffers left out) and its key count."""

    footprint: int
    keys: int


class Clock:
    """Wall and CPU time of this process, summed over the blocks it times."""

    def __init__(self) -> None:
        self.wall_s = 0.0
        self.cpu_s = 0.0

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.wall_s += time.perf_counter() - wall
            self.cpu_s += time.process_time() - cpu


@dataclass(frozen=True, slots=True)
class Part:
    """One kind of key in prq's delta."""

    kind: str
    keys: int
    encoding: str
    bytes_per_key: float
    bytes_total: float


@dataclass(slots=True)
class Measured:
    """One variant at one payload size and one count."""

    variant: str
    size: int
    requests: int
    footprint: int = 0
    keys: int = 0
    redis_cpu_s: float = 0.0
    clock: Clock = field(default_factory=Clock)
    parts: list[Part] = field(default_factory=list)

    @property
    def bytes_per_request(self) -> float:
        return self.footprint / self.requests

    @property
    def keys_per_request(self) -> float:
        return self.keys / self.requests

    @property
    def redis_us(self) -> float:
        return self.redis_cpu_s * 1e6 / self.requests

    @property
    def rate(self) -> float:
        return self.requests / self.clock.wall_s

    @property
    def client_us(self) -> float:
        return self.clock.cpu_s * 1e6 / self.requests
