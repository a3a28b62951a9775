"""What a node tells the admin view: which endpoints it uses and which it serves.

Every `presence_interval_s(settings)` (5 s, or the data-loss check interval when that is
shorter), and at once when it uses an endpoint for the first time, a node adds its endpoints to
the registry `prq:endpoints` (scored by when the node last used each, in ms since the epoch;
`ZADD GT`, so the newest use wins) and itself to `prq:{e}:rcv` of every endpoint it took from
lately (presence.lua, scored by Redis's clock, which also judges liveness). Nothing here is on
a call's path; a lost or failed report only makes the admin view a little stale.

Bounds: endpoints are stored encoded (prq.core.keys), never as raw user text; each report drops
registry entries no node used for a list TTL (1 day) and receiver entries not seen for an hour;
nodes forget endpoints they have not used for a list TTL. The registry's scores are the nodes'
wall clocks: "last used" is informational, a skewed node moves it by its skew.
"""

from __future__ import annotations

import time

from prq.core.config import QueueSettings
from prq.core.keys import KeySchema, encode_endpoint
from prq.protocol.effects import Call
from prq.protocol.scripts.liveness import presence_call

__all__ = ["RECEIVER_LIVE_REPORTS", "Presence", "presence_interval_s"]

#: A receiver counts as live while it reported within this many report intervals.
RECEIVER_LIVE_REPORTS = 3
#: Longest time between two reports of a node.
PRESENCE_INTERVAL_S = 5.0


def presence_interval_s(settings: QueueSettings) -> float:
    """How often nodes report; the admin view judges receivers live by the same figure."""
    return min(PRESENCE_INTERVAL_S, settings.data_loss_check_interval_s)


class Presence:
    """Endpoints a node used (sent to or took from) lately, and those it serves."""

    def __init__(self, keys: KeySchema, settings: QueueSettings, node_id: str) -> None:
        self.keys = keys
        self.settings = settings
        self.node_id = node_id
        #: endpoint -> when this node last sent to it or took from it (monotonic)
        self.used: dict[str, float] = {}
        #: endpoint -> when this node last took from it (monotonic)
        self.served: dict[str, float] = {}
        self.interval_s = presence_interval_s(settings)
        self.next_report = 0.0

    def sent(self, endpoint: str, now: float) -> bool:
        """Note a use; True when the endpoint is new to this node (report it soon)."""
        new = endpoint not in self.used
        self.used[endpoint] = now
        if new:
            self.next_report = now
        return new

    def took(self, endpoint: str, now: float) -> bool:
        """Note a take; True when this node did not serve the endpoint lately (report soon)."""
        new = endpoint not in self.served
        self.served[endpoint] = now
        return self.sent(endpoint, now) or new

    def due(self, now: float) -> bool:
        return now >= self.next_report

    def serve_window_s(self) -> float:
        """How long after its last take a node still counts as serving an endpoint: a take may
        wait `dequeue_timeout_s`, and a serve loop may sit between takes for a check or two."""
        settings = self.settings
        return settings.dequeue_timeout_s + 2 * self.interval_s

    def calls(self, now: float) -> list[Call]:
        """This turn's report (empty when the node used nothing lately)."""
        self.next_report = now + self.interval_s
        wall_ms = time.time() * 1000.0
        ttl_ms = int(self.settings.list_ttl_s * 1000)
        self._forget(now)
        # (copies: a blocking node's callers and serve threads note uses meanwhile, and a loop
        # over a dict another thread adds to raises RuntimeError, ending the watch thread. A
        # dict's copy() is one step; list(d.items()) is not: each pair it makes may start a
        # garbage collection, whose finalizers let another thread run amid the loop)
        used, served = self.used.copy().items(), self.served.copy().items()
        if not used:
            return []
        registry: list[str | int] = []
        for endpoint, last in used:
            registry += [int(wall_ms - (now - last) * 1000.0), encode_endpoint(endpoint)]
        calls = [
            Call(("ZADD", self.keys.endpoints, "GT", *registry)),
            Call(("ZREMRANGEBYSCORE", self.keys.endpoints, "-inf", int(wall_ms) - ttl_ms)),
            Call(("PEXPIRE", self.keys.endpoints, ttl_ms)),
        ]
        window = self.serve_window_s()
        # A receiver entry this old is dead for sure; dropping it keeps the set small.
        stale_ms = int(max(3600.0, 10 * window) * 1000.0)
        for endpoint, last in served:
            if now - last <= window:
                keys = self.keys.endpoint(endpoint)
                calls.append(presence_call(keys, self.node_id, stale_ms, ttl_ms))
        return calls

    def _forget(self, now: float) -> None:
        horizon = now - self.settings.list_ttl_s
        for table in (self.used, self.served):
            for endpoint, last in table.copy().items():  # (a copy: see `calls`)
                if last < horizon:
                    table.pop(endpoint, None)  # (one used again meanwhile is new again: harmless)
