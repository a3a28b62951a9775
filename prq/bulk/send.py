"""A bulk enqueue's round trip (BulkSending): one script call per lane (endpoint, priority,
producer, attempts), the locators and the endpoints' registry entries, with the bodies over
inline_limit_bytes spilled to the DataStreamStore and every body signed when a key is set; the
counts come from Redis's replies, and a full endpoint raises BatchRefused."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from prq.bulk.base import BulkBase
from prq.bulk.dedup import Ledger
from prq.bulk.encode import Encoded, Lane
from prq.bulk.results import BatchRefused, BulkResult
from prq.bulk.watch import LossWatch
from prq.core.errors import ConfigurationError, QueueUnavailable, SerializationError
from prq.core.models import decode_stored_request
from prq.protocol.effects import Call, Exec, Flow
from prq.protocol.flows.layout import old_layout_message
from prq.protocol.flows.registry import registry_calls
from prq.protocol.scripts.enqueue import enqueue_many_call, parse_enqueue_many

__all__ = ["BulkSending"]


class BulkSending(BulkBase):
    """How a BulkClient writes encoded requests to Redis, a round trip at a time."""

    def _sent(
        self,
        encoded: Encoded,
        pickup_timeout_s: float,
        nonce: str,
        locators: bool,
        ledger: Ledger | None,
        retry_failed: bool,
        watch: LossWatch | None = None,
    ) -> BulkResult:
        """One batch's round trip, with its refused requests added to the result."""
        by_lane, rejected = encoded
        result = self._send(
            by_lane, pickup_timeout_s, nonce, locators, ledger, retry_failed, watch=watch
        )
        result.rejected += rejected
        return result

    def _send(
        self,
        by_lane: Mapping[Lane, Sequence[tuple[str, str | bytes]]],
        pickup_timeout_s: float,
        nonce: str,
        locators: bool,
        ledger: Ledger | None = None,
        retry_failed: bool = False,
        attempt_of: tuple[str, str] = ("", ""),
        fingerprints: Mapping[Lane, Sequence[bytes]] | None = None,
        watch: LossWatch | None = None,
    ) -> BulkResult:
        """`_send_flow`, run on this client's connection."""
        return self._run(
            self._send_flow(
                by_lane, pickup_timeout_s, nonce, locators, ledger, retry_failed, attempt_of,
                fingerprints, watch,
            )
        )  # fmt: skip

    def _send_flow(
        self,
        by_lane: Mapping[Lane, Sequence[tuple[str, str | bytes]]],
        pickup_timeout_s: float,
        nonce: str,
        locators: bool,
        ledger: Ledger | None = None,
        retry_failed: bool = False,
        attempt_of: tuple[str, str] = ("", ""),
        fingerprints: Mapping[Lane, Sequence[bytes]] | None = None,
        watch: LossWatch | None = None,
    ) -> Flow[BulkResult]:
        """One round trip (after one EXISTS per endpoint, the first time it is used): a script
        call per endpoint, priority and producer (plus the locators); counts from the replies.
        `fingerprints`: those of a lane's items, in order (enqueue_many.lua stores each in its
        record). `watch` (on its endpoint; not started: on the first lane's): started before
        the writes when not started, stepped after them, in the same round trip (the slot of
        that endpoint's records); `result.data_loss` says what it saw."""
        result = BulkResult(data_loss=watch is not None and watch.lost)
        if not by_lane:
            return result
        yield from self._layouts_flow([lane[0] for lane in by_lane])
        settings = self.settings
        now_ms = int(time.time() * 1000)
        request_ttl_s = settings.request_ttl_s(pickup_timeout_s)
        locator_ttl_ms = int(settings.locator_ttl_s(pickup_timeout_s) * 1000)
        before: list[Call] = []
        after: list[Call] = []
        if watch is not None:
            before, after = watch.around_calls(watch.keys(self.keys, next(iter(by_lane))[0]))
        calls: list[Call] = list(before)
        for lane, items in by_lane.items():
            endpoint, priority, producer, attempts = lane
            items = self._spilled(endpoint, items, pickup_timeout_s)
            if self.signer is not None:
                valid_ms = int(settings.signature_ttl_s(pickup_timeout_s, max(1, attempts)) * 1000)
                items = self._signed(endpoint, items, now_ms + valid_ms)
            calls.append(
                enqueue_many_call(
                    self.keys.endpoint(endpoint),
                    nonce,
                    items,
                    now_ms,
                    int(pickup_timeout_s * 1000),
                    int(request_ttl_s * 1000),
                    int(settings.list_ttl_s * 1000),
                    priority,
                    producer,
                    attempts,
                    ledger=ledger.spelled() if ledger is not None else None,
                    retry_failed=retry_failed,
                    attempt_of=attempt_of,
                    fingerprints=fingerprints.get(lane) if fingerprints is not None else None,
                )
            )
            if locators:
                calls += [
                    Call(("SET", self.keys.locator(request_id), endpoint, "PX", locator_ttl_ms))
                    for request_id, _ in items
                ]
        # listed where the admin view and lookups by id look (as nodes do, prq.protocol.presence)
        endpoints = list(dict.fromkeys(lane[0] for lane in by_lane))
        calls += registry_calls(self.keys, settings, endpoints, now_ms)
        calls += after
        try:
            replies = yield Exec(tuple(calls))  # replay-safe (batch nonces, canary.lua)
        except QueueUnavailable as exc:  # (sent: its requests may be queued, and run)
            raise QueueUnavailable(
                f"{exc} The batch's requests may have been queued and may still run; sending "
                "them again is safe (an id is never queued twice).",
                maybe_executed=True,
            ) from exc
        assert isinstance(replies, list)
        if watch is not None:  # (before BatchRefused: what the watch saw holds either way)
            watch.read(replies[: len(before)], replies[len(replies) - len(after) :])
            result.data_loss = watch.lost
        at = len(before)
        refused: dict[str, int] = {}
        for (endpoint, *_), items in by_lane.items():
            outcome = parse_enqueue_many(replies[at], len(items))
            result.accepted += outcome.accepted
            result.duplicate_ids += outcome.duplicate_ids + outcome.gone_ids
            result.duplicate_ids += outcome.repeated_ids + outcome.conflict_ids
            result.expired_ids += outcome.gone_ids
            result.repeated_ids += outcome.repeated_ids
            result.conflict_ids += outcome.conflict_ids
            result.depths[endpoint] = outcome.depth
            if outcome.refused_ids:
                refused[endpoint] = refused.get(endpoint, 0) + len(outcome.refused_ids)
            at += 1 + (len(items) if locators else 0)
        if refused:
            raise BatchRefused(result, refused)
        return result

    def _layouts_flow(self, endpoints: Sequence[str]) -> Flow[None]:
        """Refuse endpoints that still hold the previous layout's lanes, before anything is
        written (ConfigurationError; one EXISTS each, the first time an endpoint is used)."""
        new = [e for e in dict.fromkeys(endpoints) if e not in self._layout_checked]
        if not new:
            return
        olds = [self.keys.endpoint(e).old_levels for e in new]
        found = yield Exec(tuple(Call(("EXISTS", old)) for old in olds))
        assert isinstance(found, list)
        for endpoint, old, exists in zip(new, olds, found, strict=True):
            if exists:
                raise ConfigurationError(
                    old_layout_message(endpoint, old, self.keys.endpoint(endpoint).tag)
                )
            self._layout_checked.add(endpoint)

    def _spilled(
        self, endpoint: str, items: Sequence[tuple[str, str | bytes]], pickup_timeout_s: float
    ) -> Sequence[tuple[str, str | bytes]]:
        """`items` for `endpoint`, with the bodies over inline_limit_bytes written to the
        DataStreamStore and a marker in their place (none without a store; prq.core.bodies). A body
        that is not a stored request goes as it is (its receiver dead-letters it)."""
        if self.streams.store is None:
            return items
        spilled: list[tuple[str, str | bytes]] = []
        for request_id, body in items:
            data = body.encode() if isinstance(body, str) else body
            if self.streams.spills(data):
                try:
                    request = decode_stored_request(data, endpoint, request_id)
                except SerializationError:
                    pass
                else:
                    data = self.streams.spill_request(request, data, pickup_timeout_s)
            spilled.append((request_id, data))
        return spilled

    def _signed(
        self, endpoint: str, items: Sequence[tuple[str, str | bytes]], expiry_ms: int
    ) -> list[tuple[str, str | bytes]]:
        signer = self.signer
        assert signer is not None
        return [
            (rid, signer.sign("request", rid, endpoint,
                              body.encode() if isinstance(body, str) else body, expiry_ms))
            for rid, body in items
        ]  # fmt: skip
