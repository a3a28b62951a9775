"""What every flow is given and the small helpers they share: `Context` (the node's keys,
settings, id, clocks, signer and body store), a fresh owner token, milliseconds from seconds,
and the `Exec` / `Wait` effects as the flows spell them."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prq.core.config import QueueSettings, RedisSettings
from prq.core.keys import KeySchema
from prq.protocol.effects import Call, Exec, Wait, Waitable
from prq.protocol.signing import Signer

if TYPE_CHECKING:
    from prq.protocol.stream_keeper import StreamKeeper

__all__ = ["Context", "exec_calls", "new_token", "to_ms", "wait_for"]


def to_ms(seconds: float) -> int:
    """Seconds as the whole milliseconds Redis and the scripts take; at least 1 (no zero TTL)."""
    return max(1, int(seconds * 1000))


@dataclass(frozen=True, slots=True)
class Context:
    """What flows need to know about the node: its keys, settings, id, clocks and signer."""

    keys: KeySchema
    settings: QueueSettings
    node_id: str
    wall_ms: Callable[[], int] = field(default=lambda: int(time.time() * 1000))
    #: (read through the module at each call, as wall_ms is: whoever stands in for `time` in
    #: this module, as the protocol's simulation does, moves this clock too)
    monotonic: Callable[[], float] = field(default=lambda: time.monotonic())
    #: Signs what this node writes and checks what it reads (None: no signing key).
    signer: Signer | None = None
    #: Reads back bodies kept beside Redis (prq.core.bodies); None: such a body is an error.
    bodies: StreamKeeper | None = None
    #: The endpoints this node's last take found without a max_in_flight limit: its answers
    #: there skip looking for receivers that wait for a free slot (take_flow keeps it).
    unlimited: set[str] = field(default_factory=set)
    #: The node's connection settings: their timeouts bound how long a failed take lasts,
    #: which its receipt outlives (QueueSettings.receipt_ttl_s; None: the defaults).
    redis: RedisSettings | None = None


def new_token() -> str:
    """A fresh owner token for a take."""
    return uuid.uuid4().hex


def exec_calls(*calls: Call) -> Exec:
    """Effect: send `calls` in one round trip."""
    return Exec(calls)


def wait_for(signal: Waitable, seen: int, timeout_s: float) -> Wait:
    """Effect: wait for `signal` to move past `seen`, at most `timeout_s` (never negative)."""
    return Wait(signal, seen, max(0.0, timeout_s))
