"""Reachability: the log lines that say Redis stopped answering, and that it answers again."""

from __future__ import annotations

import logging

from prq.transport.topology import redact_url

logger = logging.getLogger(__name__)

__all__ = ["Reachability"]


class Reachability:
    """Says once, at WARNING, that Redis does not answer while round trips are being retried
    (a wrong host or port, Redis down or failing over), and once, at INFO, that it answers
    again: an unreachable Redis is never silent for a whole retry budget."""

    def __init__(self, url: str, budget_s: float) -> None:
        self.url = repr(redact_url(url))
        self.budget_s = budget_s
        self.down = False

    def failed(self, exc: Exception) -> None:
        if not self.down:
            self.down = True
            logger.warning(
                "redis does not answer at %s; retrying for up to %g s: %s",
                self.url, self.budget_s, exc,
            )  # fmt: skip

    def answered(self) -> None:
        if self.down:
            self.down = False
            logger.info("redis answers again at %s", self.url)
