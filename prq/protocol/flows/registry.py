"""Finding a request by id from any node: the registry of endpoints (`prq:endpoints`, scored by
last use) and the optional id → endpoint locators, both written beside an enqueue, and
`locate_flow`, which reads them (status and cancel by id use it)."""

from __future__ import annotations

from collections.abc import Sequence

from prq.core.config import QueueSettings
from prq.core.errors import PrqError
from prq.core.keys import KeySchema, decode_endpoint, encode_endpoint
from prq.core.names import readable_endpoint
from prq.protocol.effects import Call, Flow, Reply
from prq.protocol.flows.context import Context, exec_calls, to_ms

__all__ = ["MAX_PROBED_ENDPOINTS", "locate_flow", "locator_calls", "registry_calls"]


#: Most endpoints asked for a request id that has no locator (see locate_flow).
MAX_PROBED_ENDPOINTS = 1000


def registry_calls(
    keys: KeySchema, settings: QueueSettings, endpoints: Sequence[str], now_ms: int
) -> list[Call]:
    """Add `endpoints` to the registry (`prq:endpoints`, scored by last use: newest wins)."""
    members: list[str | int] = []
    for endpoint in endpoints:
        members += [now_ms, encode_endpoint(endpoint)]
    return [
        Call(("ZADD", keys.endpoints, "GT", *members)),
        Call(("PEXPIRE", keys.endpoints, to_ms(settings.list_ttl_s))),
    ]


def locator_calls(
    keys: KeySchema, settings: QueueSettings, request_id: str, endpoint: str, pickup_s: float
) -> list[Call]:
    """The id → endpoint locator of a request, with `request_locators` (else nothing)."""
    if not settings.request_locators:
        return []
    ttl_ms = to_ms(settings.locator_ttl_s(pickup_s))
    return [Call(("SET", keys.locator(request_id), endpoint, "PX", ttl_ms))]


def locate_flow(ctx: Context, request_id: str) -> Flow[str | None]:
    """The endpoint a request id was sent to, or None if Redis does not know it.

    Requests carry no locator by default (`QueueSettings.request_locators`): the endpoints in
    the registry are asked, newest first and at most MAX_PROBED_ENDPOINTS, whether they hold
    the id, in two round trips. A request with a locator is found by the first already (the
    locator is read with the registry).
    """
    replies = yield exec_calls(
        Call(("GET", ctx.keys.locator(request_id))),
        Call(("ZRANGE", ctx.keys.endpoints, 0, MAX_PROBED_ENDPOINTS - 1, "REV")),
    )
    assert isinstance(replies, list)
    endpoint, registered = replies
    if isinstance(endpoint, bytes):
        return endpoint.decode("utf-8", errors="replace")
    names = _registered(registered)
    if not names:
        return None
    probes = [Call(("EXISTS", ctx.keys.endpoint(name).request(request_id))) for name in names]
    replies = yield exec_calls(*probes)
    assert isinstance(replies, list)
    return next((name for name, found in zip(names, replies, strict=True) if found == 1), None)


def _registered(reply: Reply) -> list[str]:
    """Endpoint names from a registry read; entries that are not valid names are skipped."""
    names: list[str] = []
    for item in reply if isinstance(reply, list) else []:
        try:
            name = decode_endpoint(item.decode() if isinstance(item, bytes) else str(item))
            names.append(readable_endpoint(name))
        except (ValueError, PrqError):
            continue
    return names
