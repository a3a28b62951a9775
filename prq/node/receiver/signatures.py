"""Signatures of the requests a receiver takes and holds: opening a taken request (its
signature checked with a signing key, under its renewal if it expired and a node renewed it),
and renewing the signatures of the signed at_least_once requests it holds, so that they can be
handed out again however long it ran them (prq.protocol.signing.Renewals).
"""

from __future__ import annotations

import contextlib
import logging
import time

from prq.core.errors import SerializationError, SignatureError
from prq.node.receiver.held import HeldRequests
from prq.protocol.effects import Call, Exec, Flow
from prq.protocol.scripts.take import TakenItem
from prq.protocol.signing import unwrap

logger = logging.getLogger(__name__)

__all__ = ["HeldSignatures"]


class HeldSignatures(HeldRequests):
    """Checking and renewing held requests' signatures (a mixin of `QueueBase`)."""

    def _open_request(self, endpoint: str, item: TakenItem) -> bytes:
        """A taken request's JSON: its signature checked (SignatureError when it fails) with
        a signing key, its envelope dropped without one."""
        signer = self.ctx.signer
        if signer is None:
            return unwrap(item.body)
        return signer.open("request", item.request_id, endpoint, item.body)

    def _open_renewed(
        self, endpoint: str, expired: list[tuple[TakenItem, SignatureError]]
    ) -> Flow[dict[str, bytes | SerializationError]]:
        """Taken items whose signature expired, checked under their renewals (one round
        trip): the request JSON by id, or the expiry error where no valid renewal is found."""
        signer = self.ctx.signer
        assert signer is not None  # (only a signer finds a signature expired)
        keys = self.keys.endpoint(endpoint)
        replies = yield Exec(tuple(Call(("GET", keys.renewal(i.request_id))) for i, _ in expired))
        assert isinstance(replies, list)
        opened: dict[str, bytes | SerializationError] = {}
        for (item, error), renewal in zip(expired, replies, strict=True):
            opened[item.request_id] = error
            if isinstance(renewal, bytes):
                with contextlib.suppress(SignatureError):
                    renewed = signer.renewed(item.body, renewal)
                    opened[item.request_id] = signer.open(
                        "request", item.request_id, endpoint, renewed
                    )
        return opened

    def _renewal_due(self, now: float) -> bool:
        """Whether a held request's signature is due for renewal (the facade's watch loop
        then runs `_renew_flow`)."""
        return bool(self._renewals.due(now, self._watch.liveness.held.__contains__))

    def _renew_flow(self) -> Flow[None]:
        """Renew the signatures of the signed requests this node holds that are due, in one
        round trip (prq.protocol.signing.Renewals): each is valid twice the renewal period from
        now."""
        signer = self.ctx.signer
        now = time.monotonic()
        due = self._renewals.due(now, self._watch.liveness.held.__contains__)
        if signer is None or not due:
            return
        valid_ms = int(2 * self._renewals.every_s * 1000)
        until_ms = self.ctx.wall_ms() + valid_ms
        ttl_ms = valid_ms + int(self.settings.signing_clock_skew_s * 1000)
        calls: list[Call] = []
        renewed: dict[str, bytes | None] = {}
        for request_id, endpoint, envelope in due:
            try:
                header = signer.renewal("request", request_id, endpoint, envelope, until_ms)
            except SignatureError as exc:  # (its key retired meanwhile: it expires in time)
                logger.warning("signature not renewed request_id=%s error=%s", request_id, exc)
                renewed[request_id] = None
                continue
            key = self.keys.endpoint(endpoint).renewal(request_id)
            calls.append(Call(("SET", key, header, "PX", ttl_ms)))
            renewed[request_id] = signer.renewed(envelope, header)
        if calls:
            yield Exec(tuple(calls))
        self._renewals.renewed(renewed, now)
