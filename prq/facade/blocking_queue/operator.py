"""BlockingOperator: the operator's API of Queue (dead letters, capacity limits, forgetting an
endpoint).

Each method is one flow of prq.protocol (dead, limits, forget) run once the queue is ready;
none of them is on a call's path.
"""

from __future__ import annotations

from prq.facade.blocking_queue.driver import BlockingDriver
from prq.protocol.dead import (
    DeadLetter,
    ReplayOutcome,
    dead_letters_flow,
    purge_dead_letters_flow,
    replay_dead_letter_flow,
)
from prq.protocol.forget import ForgetOutcome, forget_endpoint_flow
from prq.protocol.limits import EndpointLimits, limits_flow, set_limits_flow

__all__ = ["BlockingOperator"]


class BlockingOperator(BlockingDriver):
    """Queue's operator's API (a mixin over BlockingDriver's state and flow driver)."""

    def dead_letters(self, endpoint: str, *, offset: int = 0, limit: int = 100) -> list[DeadLetter]:
        """The endpoint's dead letters, newest first (see prq.protocol.dead)."""
        self._ready()
        return self._run(dead_letters_flow(self.ctx, endpoint, offset=offset, limit=limit))

    def replay_dead_letter(self, endpoint: str, request_id: str) -> ReplayOutcome:
        """Queue a dead letter again under its id, once: "replayed", "live" (the id is queued or
        in flight already) or "missing" (no such dead letter, e.g. replayed before)."""
        self._ready()
        return self._run(replay_dead_letter_flow(self.ctx, endpoint, request_id))

    def purge_dead_letters(self, endpoint: str, request_ids: list[str] | None = None) -> int:
        """Drop the named dead letters (None: all of the endpoint's); how many were dropped."""
        self._ready()
        return self._run(purge_dead_letters_flow(self.ctx, endpoint, request_ids))

    def forget_endpoint(self, endpoint: str, *, force: bool = False) -> ForgetOutcome:
        """Remove the endpoint from the registry (the admin views' list), unless it holds work
        or has a live receiver (`force`: anyway); never removes a request. See
        prq.protocol.forget."""
        self._ready()
        return self._run(forget_endpoint_flow(self.ctx, endpoint, force=force))

    def limits(self, endpoint: str) -> EndpointLimits:
        """The endpoint's capacity limits (max_in_flight, max_pending), as every node sees them."""
        self._ready()
        return self._run(limits_flow(self.ctx, endpoint))

    def set_limits(
        self,
        endpoint: str,
        *,
        max_in_flight: int | None = None,
        max_pending: int | None = None,
    ) -> EndpointLimits:
        """Replace the endpoint's capacity limits (None: no limit); see prq.protocol.limits."""
        self._ready()
        flow = set_limits_flow(
            self.ctx, endpoint, max_in_flight=max_in_flight, max_pending=max_pending
        )
        return self._run(flow)
