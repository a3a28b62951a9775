"""What a setting's value may be: `duration` and `count` fields, and reading a value others
follow (`positive`).

Every duration of QueueSettings and RedisSettings is finite (the models refuse inf and nan), at
least MIN_DURATION_S (or 0 where 0 means "none") and at most MAX_DURATION_S, and every size or
count the scripts are given at most MAX_COUNT, so that no value they accept breaks a call later:
a TTL Redis refuses, a number a script cannot hold exactly, a wait a thread or a socket refuses
(OverflowError).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field

__all__ = [
    "MAX_COUNT",
    "MAX_DURATION_S",
    "MIN_DURATION_S",
    "call_duration",
    "count",
    "duration",
    "positive",
]

#: The shortest a duration setting may be (unless it may be 0): Redis TTLs and the scripts'
#: deadlines are whole milliseconds, and a shorter one would round to none.
MIN_DURATION_S = 0.001
#: The longest a duration setting may be: ten years. The TTLs derived from the settings add
#: several of them (a request's data outlives `max_attempts` attempts, up to 1000), and each
#: must stay a whole number of milliseconds the scripts hold exactly (Lua numbers: up to 2**53,
#: some 285,000 years), a TTL Redis takes, and a wait threads and sockets take (at most some
#: 290 years).
MAX_DURATION_S = 10 * 365 * 86400.0
#: The largest size or count a setting may give: the largest integer the scripts hold exactly.
MAX_COUNT = 2**53 - 1


def duration(default: float, *, zero_ok: bool = False) -> Any:
    """A duration field, in seconds: at least MIN_DURATION_S (0 when `zero_ok`), at most
    MAX_DURATION_S (finite: the models set `allow_inf_nan=False`)."""
    return Field(default, ge=0 if zero_ok else MIN_DURATION_S, le=MAX_DURATION_S)


def count(default: int, *, least: int) -> Any:
    """A size or count field: from `least` to MAX_COUNT."""
    return Field(default, ge=least, le=MAX_COUNT)


def positive(value: Any) -> float | None:
    """`value` (given, or read from the environment as text) as a finite positive number;
    None when it is not one (its field's validation then says what is wrong)."""
    try:
        number = float(value)
    except (TypeError, ValueError, ArithmeticError):  # (ArithmeticError: an int too large)
        return None
    return number if math.isfinite(number) and number > 0 else None


def call_duration(name: str, value: float) -> float:
    """A duration given to one call (a pickup window written into Redis), held to the settings'
    bounds: InvalidRequest, naming `name`, for anything but a finite number of seconds from
    MIN_DURATION_S to MAX_DURATION_S (an infinite one broke the call with a raw OverflowError)."""
    from prq.core.errors import InvalidRequest

    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if (
        number is None
        or not math.isfinite(number)
        or not (MIN_DURATION_S <= number <= MAX_DURATION_S)
    ):
        rule = f"must be a finite number of seconds from {MIN_DURATION_S:g} to {MAX_DURATION_S:g}"
        raise InvalidRequest(
            f"invalid call: {name}: {rule}",
            errors=[{"loc": (name,), "msg": rule, "type": "value_error"}],
        )
    return float(number)
