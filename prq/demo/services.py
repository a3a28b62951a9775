"""The methods the demo's receiver nodes serve (echo, sum, sleep, flaky): the rules, no I/O.

Both node kinds share them: the async node awaits `sleep_ms`, the threaded node blocks on it,
and both then return `compute(request)`.
"""

from __future__ import annotations

import random

from pydantic import JsonValue

from prq.core.models import Request

__all__ = ["DEFAULT_FLAKY_FAILURE_RATE", "SimulatedFailure", "compute", "sleep_ms"]

#: Share of `flaky` calls that raise, so errors show up in the table.
DEFAULT_FLAKY_FAILURE_RATE = 0.2


class SimulatedFailure(Exception):
    """What the `flaky` method raises now and then."""


def compute(request: Request) -> JsonValue:
    """The CPU part of every method (shared by the async and the threaded handler)."""
    params = request.params if isinstance(request.params, dict) else {}
    if request.method == "echo":
        return request.params
    if request.method == "sum":
        values = params.get("values")
        numbers = (
            [v for v in values if isinstance(v, int | float)] if isinstance(values, list) else []
        )
        return {"total": sum(numbers), "count": len(numbers)}
    if request.method == "sleep":
        return {"slept_ms": params.get("ms", 0)}
    if request.method == "flaky":
        if random.random() < DEFAULT_FLAKY_FAILURE_RATE:  # noqa: S311 (a demo's failure rate)
            raise SimulatedFailure(f"simulated failure in {request.endpoint} (flaky on purpose)")
        return "ok"
    raise ValueError(f"unknown method {request.method!r}")


def sleep_ms(request: Request) -> float:
    """How long the handler waits before answering: `ms` of a `sleep` call, else 0."""
    if request.method != "sleep" or not isinstance(request.params, dict):
        return 0.0
    ms = request.params.get("ms", 0)
    return float(ms) if isinstance(ms, int | float) else 0.0
