"""The shrunk timings of every fault scenario, and in-process queues that use them.

`FAULT_TIMINGS` / `FAULT_REDIS_SETTINGS` are the reliability knobs, shrunk (heartbeat 1 s,
receiver timeout 5 s, sender timeout 6 s, poll 1 s, data-loss check 1 s, pickup 10 s, retry
budget 5 s, socket timeout 2 s); production values are prq.core.config's defaults (the README's
Configuration table), so every bound a scenario asserts scales to production.
`fault_settings(**overrides)` and `fault_redis_settings(url, **overrides)` build the typed
objects; `FaultQueueFactory` is the integration suite's `QueueFactory` with these timings.
"""

from __future__ import annotations

from typing import Any

from prq import QueueSettings, RedisSettings
from tests.queue_facades import AnyQueue, QueueFactory

__all__ = [
    "FAULT_REDIS_SETTINGS",
    "FAULT_TIMINGS",
    "FaultQueueFactory",
    "fault_redis_settings",
    "fault_settings",
]

#: QueueSettings of every fault scenario (production values: prq.core.config's defaults).
FAULT_TIMINGS: dict[str, Any] = {
    "heartbeat_interval_s": 1.0,
    # The first beat must come well inside the receiver timeout (7 s in production, of 60 s).
    "heartbeat_initial_delay_s": 0.5,
    "receiver_timeout_s": 5.0,
    "sender_timeout_s": 6.0,
    "data_loss_check_interval_s": 1.0,
    "poll_interval_s": 1.0,
    "pickup_timeout_s": 10.0,
    "retry_budget_s": 5.0,
    "dequeue_timeout_s": 5.0,
}
#: RedisSettings overrides of every fault scenario.
FAULT_REDIS_SETTINGS: dict[str, Any] = {"socket_timeout_s": 2.0, "connect_timeout_s": 2.0}


def fault_settings(**overrides: Any) -> QueueSettings:
    """QueueSettings with FAULT_TIMINGS, updated by `overrides`."""
    return QueueSettings(**{**FAULT_TIMINGS, **overrides})


def fault_redis_settings(url: str, **overrides: Any) -> RedisSettings:
    """RedisSettings for `url` with FAULT_REDIS_SETTINGS, updated by `overrides`."""
    return RedisSettings(url=url, **{**FAULT_REDIS_SETTINGS, **overrides})


class FaultQueueFactory(QueueFactory):
    """`QueueFactory` with FAULT_TIMINGS and FAULT_REDIS_SETTINGS instead of the fast defaults."""

    def settings(self, **overrides: Any) -> QueueSettings:
        return fault_settings(**overrides)

    def __call__(
        self,
        *,
        url: str | None = None,
        redis_settings: RedisSettings | None = None,
        **overrides: Any,
    ) -> AnyQueue:
        """A node through `url` (a proxy's URL) or straight to the server."""
        redis_settings = redis_settings or fault_redis_settings(url or self.url)
        return super().__call__(redis_settings=redis_settings, **overrides)
