"""`Redelivery`: what the scripts that may hand an at_least_once request out again (take,
read_response, hand_back, unpark; scripts/_redeliver.lua) need to know, from the settings."""

from __future__ import annotations

from dataclasses import dataclass

from prq.core.config import QueueSettings, RedisSettings

__all__ = ["Redelivery"]


@dataclass(frozen=True, slots=True)
class Redelivery:
    """What the scripts that may hand an at_least_once request out again need to know
    (scripts/_redeliver.lua)."""

    request_ttl_extra_ms: int
    list_ttl_ms: int
    dead_letter_ttl_ms: int
    dead_letter_max: int
    #: For a hand-off taken back (scripts/_handoff.lua): its confirmation window, and the TTLs
    #: of a taken request and of a take receipt.
    handoff_confirm_ms: int
    in_flight_ttl_ms: int
    receipt_ttl_ms: int

    @classmethod
    def of(cls, settings: QueueSettings, redis: RedisSettings | None = None) -> Redelivery:
        """From the node's settings (`redis`: its connection settings, which the receipt TTL
        follows; None: the defaults)."""
        return cls(
            int(settings.request_ttl_extra_s * 1000),
            int(settings.list_ttl_s * 1000),
            int(settings.dead_letter_ttl_s * 1000),
            settings.dead_letter_max,
            int(settings.handoff_confirm_s * 1000),
            int(settings.in_flight_ttl_s() * 1000),
            int(settings.receipt_ttl_s(redis) * 1000),
        )
