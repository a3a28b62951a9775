"""A read-only view of a queue for operators: endpoints, their queues, and Redis's health.

`Inspector` reads what the nodes keep in Redis and never changes it, so it runs as the
read-only ACL user of `redis-conf/users.acl`. Where its figures come from:

- endpoints: the registry `prq:endpoints`, where every node lists the endpoints it used lately
  (prq.protocol.presence), newest use first, capped at `max_endpoints`;
- depth: the ids queued over all the endpoint's priority levels (prq.protocol.levels), with the
  depth of each level: withdrawn and cancelled ids leave them (see withdraw.lua); ids whose sender
  died without withdrawing stay until a take skips them;
- in flight: the endpoint's in-flight set, counting entries touched (taken or beaten) within a
  request's in-flight TTL;
- oldest age: the creation time of the oldest live request among the first few of each level;
- receivers: nodes that reported taking from the endpoint within a few report intervals (nodes
  report every 5 s, see prq.protocol.presence);
- limits: the endpoint's capacity limits hash (prq.protocol.limits), read in the same round trip; a
  stored value that is not a positive integer shows as None (no limit) and logs a warning;
- dead letters: the size of the endpoint's dead-letter set (prq.protocol.dead), in the same round
  trip; `dead_letters()` lists them with prq.protocol.dead's own listing flow, driven here with
  reads only;
- queued requests and dead letters: a stored body (up to max_body_bytes) is read only within
  prq.protocol.dead's bounds (BODY_READ_MAX_BYTES each, BODY_READ_BUDGET_BYTES per listing), its
  size always coming from HSTRLEN; one listed beyond them shows its size only (`body_read=False`).

Each figure is read in a few pipelined round trips however many endpoints there are, so the
admin service can collect them on every scrape. Changes (cancel) go through the queue API.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any, Self, TypeVar

import redis.asyncio
from pydantic import BaseModel
from redis.exceptions import RedisError

from prq.core import bodies
from prq.core.config import QueueSettings, RedisSettings
from prq.core.errors import QueueUnavailable, SerializationError
from prq.core.keys import EndpointKeys, KeySchema, decode_endpoint, encode_endpoint
from prq.core.models import decode_stored_request, readable_endpoint
from prq.core.records import (
    QUEUED_HEAD_BYTES,
    body_size_bound,
    first_fields,
    join_body,
    queued_body_size,
    queued_head,
    queued_values,
    rest_fields,
)
from prq.protocol.dead import DeadLetter, bodies_to_read, dead_letters_flow
from prq.protocol.effects import Call, Exec, Flow
from prq.protocol.flows.context import Context
from prq.protocol.health import INFO_CALLS, parse_info, redis_persistence, redis_warnings
from prq.protocol.levels import levels_call, levels_from, queued_ids_flow
from prq.protocol.limits import MAX_LIMIT, EndpointLimits
from prq.protocol.presence import RECEIVER_LIVE_REPORTS, presence_interval_s
from prq.protocol.signing import unwrap
from prq.transport.redis_io import RedisUnavailable, client_kwargs, translate_errors
from prq.transport.topology import aclose_client, async_client, is_cluster

__all__ = [
    "EndpointInfo",
    "Inspector",
    "PriorityDepth",
    "QueuedItem",
    "QueuedPage",
    "RedisHealth",
    "RedisMemory",
    "redis_warnings",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How many of a level's first ids are looked at to find the oldest live request.
OLDEST_PROBE = 10
#: Most priority levels an endpoint's listing shows, highest first (its depth counts them all).
SHOWN_LEVELS = 32
#: Most queued requests one page may list.
MAX_PAGE = 500
#: The only commands a flow driven by the Inspector may send (see `_read_flows`).
_FLOW_READS = frozenset(
    {"ZRANGE", "ZCARD", "ZCOUNT", "HMGET", "HSTRLEN", "GET", "GETRANGE", "LRANGE"}
)


class PriorityDepth(BaseModel):
    """How many requests wait at one priority."""

    priority: int
    depth: int


class EndpointInfo(BaseModel):
    """One endpoint, as Redis sees it now."""

    endpoint: str
    #: Requests waiting for pickup.
    depth: int
    #: Requests picked up and not answered yet.
    in_flight: int
    #: Age of the oldest queued request, seconds (None when nothing is queued).
    oldest_age_s: float | None
    #: Receiver nodes that took from the endpoint within the last few checks.
    receivers: int
    #: The endpoint's enqueue counter: requests enqueued since Redis last lost its data (a bulk
    #: batch sent whole counts each of its places, queued or not: scripts/enqueue_many.lua).
    enqueued_total: int
    #: When a node last reported using the endpoint, ms since the epoch (0: never).
    last_seen_ms: int
    #: Most requests picked up and unanswered at once across all receivers (None: no limit).
    max_in_flight: int | None = None
    #: Most requests queued at once; enqueues beyond it raise QueueFull (None: no limit).
    max_pending: int | None = None
    #: Dead letters kept for the endpoint (see prq.protocol.dead; they expire and are capped).
    dead_letters: int = 0
    #: Requests waiting per priority, highest first (at most SHOWN_LEVELS levels).
    priorities: list[PriorityDepth] = []


class QueuedItem(BaseModel):
    """One queued request, without its parameters."""

    id: str
    method: str
    service: str
    #: None when the body was not read (see `body_read`).
    priority: int | None
    producer: str | None
    created_ms: int
    age_s: float
    body_bytes: int
    #: Why the stored request could not be read (it is listed all the same), else None.
    error: str | None = None
    #: False when the body was too large to read for a listing (over
    #: prq.protocol.dead.BODY_READ_MAX_BYTES, or past the page's BODY_READ_BUDGET_BYTES): its size
    #: and age are right; its method and service are empty, its priority and producer None.
    body_read: bool = True


class QueuedPage(BaseModel):
    """A page of an endpoint's queued requests in the order takes hand them out: highest
    priority first, producers taking turns within a priority (prq.protocol.levels)."""

    endpoint: str
    offset: int
    limit: int
    #: Requests queued in all (the page holds at most `limit` of them).
    total: int
    items: list[QueuedItem]


class RedisHealth(BaseModel):
    """Whether Redis answers, and whether its configuration suits prq (see prq.protocol.health)."""

    ok: bool
    version: str | None = None
    maxmemory_policy: str | None = None
    #: Kinds of persistence in use: "aof", "rdb snapshots"; empty when none.
    persistence: list[str] = []
    #: Why this Redis would lose requests silently or defeat data-loss detection.
    warnings: list[str] = []
    #: Why Redis could not be asked (when `ok` is false).
    error: str | None = None


class RedisMemory(BaseModel):
    """One Redis server's memory and evictions (INFO memory and INFO stats): how close it is
    to refusing writes (prq wants `noeviction`, so a full Redis refuses enqueues with
    QueueFull), or, misconfigured, how many keys it dropped (each one a request lost silently)."""

    #: The server: host:port (a cluster's primary, or the one server), or a Sentinel-managed
    #: primary's master name (its address changes with a failover).
    node: str
    used_memory_bytes: int
    #: Redis's maxmemory; 0 when it has no limit.
    maxmemory_bytes: int
    #: Keys evicted since the server started.
    evicted_keys: int


class Inspector:
    """Reads the state of one key prefix for operators; never writes.

    Example:
        inspector = Inspector.from_url("redis://localhost:6379/0")
        for info in await inspector.endpoints():
            print(info.endpoint, info.depth, info.in_flight)
        await inspector.aclose()
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        *,
        prefix: str = "prq",
        settings: QueueSettings | None = None,
        max_endpoints: int = 1000,
    ) -> None:
        self.client = client
        self.keys = KeySchema(prefix)
        self.settings = settings or QueueSettings()
        self.max_endpoints = max_endpoints

    @classmethod
    def from_url(
        cls,
        url: str | None = None,
        *,
        prefix: str = "prq",
        settings: QueueSettings | None = None,
        redis_settings: RedisSettings | None = None,
    ) -> Self:
        """An inspector with its own small connection pool (`url` or `PRQ_REDIS_URL`)."""
        rs = redis_settings or RedisSettings.from_url(url)
        kwargs = client_kwargs(rs) | {"max_connections": 4}
        return cls(async_client(rs.url, kwargs), prefix=prefix, settings=settings)

    async def aclose(self) -> None:
        await aclose_client(self.client)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- endpoints ------------------------------------------------------------------------------

    async def endpoints(self) -> list[EndpointInfo]:
        """Every endpoint nodes reported lately (at most `max_endpoints`, newest first kept),
        sorted by name."""
        now_ms, seen = await self._registry()
        infos = await self._describe(sorted(seen), now_ms)
        return [info.model_copy(update={"last_seen_ms": seen[info.endpoint]}) for info in infos]

    async def enqueued_totals(self) -> dict[str, int]:
        """Every reported endpoint's enqueue counter: two round trips, one read per endpoint
        (what a throughput sampler needs, without the rest of `endpoints()`)."""
        _, seen = await self._registry()
        names = sorted(seen)
        if not names:
            return {}
        with _reading():
            pipe = self.client.pipeline(transaction=False)
            for endpoint in names:
                pipe.get(self.keys.endpoint(endpoint).sequence)
            counters = await pipe.execute()
        return {name: int(value or 0) for name, value in zip(names, counters, strict=True)}

    async def _registry(self) -> tuple[int, dict[str, int]]:
        """Redis's time (ms) and the endpoints nodes reported: name -> last seen (ms)."""
        with _reading():
            pipe = self.client.pipeline(transaction=False)
            pipe.execute_command("TIME")
            pipe.execute_command(
                "ZRANGE", self.keys.endpoints, 0, self.max_endpoints - 1, "REV", "WITHSCORES"
            )
            now_reply, registry = await pipe.execute()
        seen: dict[str, int] = {}
        for encoded, score in _pairs(registry):
            try:
                endpoint = readable_endpoint(decode_endpoint(_text(encoded)))
            except (ValueError, UnicodeDecodeError):
                continue  # not written by prq: never shown, never used in a key
            if encode_endpoint(endpoint) != _text(encoded):
                continue  # not prq's encoding of any name (e.g. a stray "%ZZ")
            seen[endpoint] = int(float(score))
        return _server_ms(now_reply), seen

    async def endpoint(self, endpoint: str) -> EndpointInfo:
        """One endpoint, registered or not (raises InvalidEndpoint for a bad name)."""
        endpoint = readable_endpoint(endpoint)
        with _reading():
            pipe = self.client.pipeline(transaction=False)
            pipe.execute_command("TIME")
            pipe.execute_command("ZSCORE", self.keys.endpoints, encode_endpoint(endpoint))
            now_reply, score = await pipe.execute()
        (info,) = await self._describe([endpoint], _server_ms(now_reply))
        return info.model_copy(update={"last_seen_ms": int(float(score or 0))})

    async def _describe(self, endpoints: Sequence[str], now_ms: int) -> list[EndpointInfo]:
        """Every endpoint's figures, the endpoints read side by side: one round trip, plus two
        when something is queued (the levels' sizes and heads, then the heads' states)."""
        return await self._read_flows([self._describe_flow(e, now_ms) for e in endpoints])

    def _describe_flow(self, endpoint: str, now_ms: int) -> Flow[EndpointInfo]:
        keys = self.keys.endpoint(endpoint)
        in_flight_from = now_ms - int(self.settings.in_flight_ttl_s() * 1000)
        live_from = now_ms - int(RECEIVER_LIVE_REPORTS * presence_interval_s(self.settings) * 1000)
        replies = yield Exec(
            (
                Call(("ZCOUNT", keys.running, in_flight_from, "+inf")),
                Call(("ZCOUNT", keys.receivers, live_from, "+inf")),
                Call(("GET", keys.sequence)),
                Call(("HMGET", keys.limits, "mif", "mp")),
                Call(("ZCARD", keys.dead[0])),
                levels_call(keys),
            )
        )
        assert isinstance(replies, list)
        in_flight, receivers, counter, limits, dead, found = replies
        levels = yield from levels_from(keys, found, head=OLDEST_PROBE)
        head = [request_id for level in levels[:SHOWN_LEVELS] for request_id in level.head]
        created_ms = []
        if head:
            # each record read both ways in one round trip: the call of the other form answers
            # WRONGTYPE (a request queued by BulkClient is a string until picked up:
            # prq.core.records)
            calls = [
                call
                for i in head
                for call in (
                    Call(("HMGET", keys.request(i), "st", "ct")),
                    Call(("GETRANGE", keys.request(i), 0, QUEUED_HEAD_BYTES - 1)),
                )
            ]
            replies = yield Exec(tuple(calls))
            assert isinstance(replies, list)
            for hashed, strung in zip(replies[::2], replies[1::2], strict=True):
                st, created = _either_form(hashed, strung, ("st", "ct"))
                if _text(st) == "queued" and _text(created).isdigit():
                    created_ms.append(int(_text(created)))
        oldest = min(created_ms, default=None)
        max_in_flight, max_pending = limits
        return EndpointInfo(
            endpoint=endpoint,
            depth=sum(level.depth for level in levels),
            in_flight=int(in_flight),
            oldest_age_s=None if oldest is None else max(0.0, (now_ms - oldest) / 1000),
            receivers=int(receivers),
            enqueued_total=int(counter or 0),
            last_seen_ms=0,
            max_in_flight=_stored_limit(endpoint, "max_in_flight", max_in_flight),
            max_pending=_stored_limit(endpoint, "max_pending", max_pending),
            dead_letters=int(dead or 0),
            priorities=[
                PriorityDepth(priority=level.priority, depth=level.depth)
                for level in levels[:SHOWN_LEVELS]
            ],
        )

    async def limits(self, endpoint: str) -> EndpointLimits:
        """The endpoint's capacity limits (raises InvalidEndpoint for a bad name); a malformed
        stored value shows as None, with a warning, as in `endpoints()`."""
        endpoint = readable_endpoint(endpoint)
        with _reading():
            max_in_flight, max_pending = await self.client.hmget(
                self.keys.endpoint(endpoint).limits, ["mif", "mp"]
            )
        return EndpointLimits(
            endpoint=endpoint,
            max_in_flight=_stored_limit(endpoint, "max_in_flight", max_in_flight),
            max_pending=_stored_limit(endpoint, "max_pending", max_pending),
        )

    async def queued(self, endpoint: str, offset: int = 0, limit: int = 50) -> QueuedPage:
        """A page of the endpoint's queued requests in take order (QueuedPage); ids that are no
        longer queued, about to be skipped by a take, are left out of the page."""
        endpoint = readable_endpoint(endpoint)
        if offset < 0 or not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"offset must be >= 0 and limit within 1..{MAX_PAGE}")
        keys = self.keys.endpoint(endpoint)
        ctx = Context(self.keys, self.settings, node_id="inspector")
        ((total, ids),) = await self._read_flows([queued_ids_flow(ctx, endpoint, offset, limit)])
        with _reading():
            # each record read both ways in one round trip: the calls of the other form answer
            # WRONGTYPE (a request queued by BulkClient is a string until picked up:
            # prq.core.records); a string's head is read, not its body
            pipe = self.client.pipeline(transaction=False)
            pipe.execute_command("TIME")
            for request_id in ids:
                key = keys.request(request_id)
                pipe.hmget(key, ["st", "ct", "bk"])
                pipe.hstrlen(key, "b")
                pipe.strlen(key)
                pipe.getrange(key, 0, QUEUED_HEAD_BYTES - 1)
            now_reply, *replies = await pipe.execute(raise_on_error=False)
        if isinstance(now_reply, Exception):
            raise now_reply
        now_ms = _server_ms(now_reply)
        queued, strung = [], set()
        for n, request_id in enumerate(ids):
            hashed, piece_size, length, head = replies[4 * n : 4 * n + 4]
            if isinstance(hashed, list):
                st, created, count = hashed
                if _text(st) == "queued":
                    queued.append((request_id, created, body_size_bound(piece_size, count)))
            elif isinstance(length, int) and isinstance(head, bytes):
                fields = queued_head(head) or {}
                queued.append((request_id, fields.get("ct"), queued_body_size(head, length)))
                strung.add(request_id)
            else:
                _raise_unless_wrongtype(hashed, length, head)
        wanted = bodies_to_read([size for _, _, size in queued])
        read = [request_id for (request_id, _, _), ok in zip(queued, wanted, strict=True) if ok]
        bodies = await self._bodies(keys, [i for i in read if i not in strung])
        bodies |= await self._string_bodies(keys, [i for i in read if i in strung])
        items = []
        for request_id, created, size in queued:
            if request_id not in bodies:
                items.append(_unread_item(request_id, created, size, now_ms))
            elif (body := bodies[request_id]) is not None:  # else: gone since it was listed
                items.append(_queued_item(request_id, endpoint, body, created, now_ms))
        return QueuedPage(
            endpoint=endpoint, offset=offset, limit=limit, total=int(total), items=items
        )

    async def _bodies(self, keys: EndpointKeys, ids: list[str]) -> dict[str, bytes | None]:
        """The stored bodies of these requests (None: the request is gone), one round trip."""
        if not ids:
            return {}
        with _reading():
            pipe = self.client.pipeline(transaction=False)
            for request_id in ids:
                pipe.hmget(keys.request(request_id), first_fields())
            firsts = dict(zip(ids, await pipe.execute(), strict=True))
            pieced = {i: rest_fields(count) for i, (_, count) in firsts.items()}
            pieced = {i: names for i, names in pieced.items() if names}
            rests: dict[str, list[bytes | None]] = {}
            if pieced:  # bodies kept in pieces (prq.core.records): a second read for the rest
                pipe = self.client.pipeline(transaction=False)
                for request_id, names in pieced.items():
                    pipe.hmget(keys.request(request_id), names)
                rests = dict(zip(pieced, await pipe.execute(), strict=True))
        return {i: join_body(first, rests.get(i, [])) for i, (first, _) in firsts.items()}

    async def _string_bodies(self, keys: EndpointKeys, ids: list[str]) -> dict[str, bytes | None]:
        """The bodies of these records in the queued form (None: picked up or gone since they
        were listed: MGET answers nil for a hash), one round trip."""
        if not ids:
            return {}
        with _reading():
            raws = await self.client.mget([keys.request(i) for i in ids])
        return {
            i: queued_values(raw, ["b"])[0] if isinstance(raw, bytes) else None
            for i, raw in zip(ids, raws, strict=True)
        }

    async def dead_letters(
        self, endpoint: str, offset: int = 0, limit: int = 100
    ) -> list[DeadLetter]:
        """The endpoint's dead letters, newest first, as `Queue.dead_letters` lists them (raises
        InvalidEndpoint for a bad name, ValueError for a bad page: limit within 1..1000)."""
        ctx = Context(self.keys, self.settings, node_id="inspector")
        flow = dead_letters_flow(ctx, endpoint, offset=offset, limit=limit)
        (letters,) = await self._read_flows([flow])
        return letters

    async def _read_flows(self, flows: Sequence[Flow[T]]) -> list[T]:
        """Drive protocol flows that only read, side by side: the Execs the flows ask for at
        one step go in one pipeline. A flow that asks for anything but `_FLOW_READS` (a script,
        a write, a wait) is refused before anything of that step is sent."""
        results: dict[int, T] = {}
        replies: dict[int, object] = dict.fromkeys(range(len(flows)))
        try:
            while replies:
                asked: dict[int, Exec] = {}
                for i, sent in replies.items():
                    try:
                        effect = flows[i].send(sent)
                    except StopIteration as done:
                        results[i] = done.value
                        continue
                    if not isinstance(effect, Exec) or not all(
                        call.script is None and str(call.args[0]).upper() in _FLOW_READS
                        for call in effect.calls
                    ):
                        raise RuntimeError(f"the Inspector only reads; refused {effect!r:.200}")
                    asked[i] = effect
                replies = {}
                if not asked:
                    break
                with _reading():
                    pipe = self.client.pipeline(transaction=False)
                    for effect in asked.values():
                        for call in effect.calls:
                            pipe.execute_command(*call.args)
                    flat = await pipe.execute(raise_on_error=False)
                _raise_unless_wrongtype(*flat)
                at = 0
                for i, effect in asked.items():
                    replies[i] = flat[at : at + len(effect.calls)]
                    at += len(effect.calls)
        finally:
            for flow in flows:
                flow.close()
        return [results[i] for i in range(len(flows))]

    # -- Redis ----------------------------------------------------------------------------------

    async def redis_health(self) -> RedisHealth:
        """Ping Redis and judge its configuration from INFO (CONFIG is not granted to prq's
        ACL users); never raises for an unreachable Redis."""
        try:
            pipe = self.client.pipeline(transaction=False)
            for args in INFO_CALLS:
                pipe.execute_command(*args)
            replies = await pipe.execute()
        except RedisError as exc:
            return RedisHealth(ok=False, error=f"{type(exc).__name__}: {exc}")
        info = parse_info(*replies)
        return RedisHealth(
            ok=True,
            version=info.get("redis_version"),
            maxmemory_policy=info.get("maxmemory_policy"),
            persistence=redis_persistence(info),
            warnings=redis_warnings(info),
        )

    async def redis_memory(self) -> list[RedisMemory]:
        """Each server's memory and evictions: the one server (or Sentinel-managed primary), or
        every primary of a cluster (each holds its own endpoints). QueueUnavailable when Redis
        does not answer."""
        client: Any = self.client  # a cluster client, or not: typed as one server's
        with _reading():
            if is_cluster(client):
                primaries = client.get_primaries()
                replies = await asyncio.gather(
                    *(self._memory_info(target_nodes=node) for node in primaries)
                )
                names = [node.name for node in primaries]
            else:
                replies = [await self._memory_info()]
                names = [_server_name(client)]
        return [
            RedisMemory(
                node=name,
                used_memory_bytes=_int(info.get("used_memory")),
                maxmemory_bytes=_int(info.get("maxmemory")),
                evicted_keys=_int(info.get("evicted_keys")),
            )
            for name, info in zip(names, replies, strict=True)
        ]

    async def _memory_info(self, **target: Any) -> dict[str, str]:
        """INFO memory and INFO stats of one server, merged (two calls: `INFO a b` needs
        Redis 7)."""
        client: Any = self.client
        memory = await client.execute_command("INFO", "memory", **target)
        stats = await client.execute_command("INFO", "stats", **target)
        return parse_info(memory, stats)


def _server_name(client: Any) -> str:
    """A one-server client's host:port (a socket's path), or a Sentinel pool's master name."""
    pool = client.connection_pool
    service_name = getattr(pool, "service_name", None)
    if service_name:
        return str(service_name)
    kwargs = pool.connection_kwargs
    if "path" in kwargs:
        return str(kwargs["path"])
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def _int(value: Any) -> int:
    """An INFO figure as an integer (0 when missing or not one)."""
    try:
        return int(str(value))
    except ValueError:
        return 0


@contextlib.contextmanager
def _reading() -> Iterator[None]:
    """prq's errors for a read: QueueUnavailable when Redis does not answer (not retried: an
    operator's view should say so at once)."""
    try:
        with translate_errors():
            yield
    except RedisUnavailable as exc:
        raise QueueUnavailable(f"Redis did not answer: {exc}") from exc


def _created(created: Any, now_ms: int) -> tuple[int, float]:
    """A request's creation time (ms since the epoch, 0 when unknown) and its age, seconds."""
    created_ms = int(_text(created) or 0)
    return created_ms, max(0.0, (now_ms - created_ms) / 1000) if created_ms else 0.0


def _unread_item(request_id: str, created: Any, size: int, now_ms: int) -> QueuedItem:
    created_ms, age_s = _created(created, now_ms)
    return QueuedItem(
        id=request_id, method="", service="", priority=None, producer=None,
        created_ms=created_ms, age_s=age_s, body_bytes=size, body_read=False,
    )  # fmt: skip


def _queued_item(
    request_id: str, endpoint: str, body: bytes, created: Any, now_ms: int
) -> QueuedItem:
    created_ms, age_s = _created(created, now_ms)
    size = len(body)
    try:
        data = unwrap(body)
        request = decode_stored_request(bodies.stub(data), endpoint, request_id)
        if bodies.is_spilled(data):  # kept beside Redis (prq.core.bodies): its size is the body's
            size = bodies.parse(data).length
    except SerializationError as exc:
        return QueuedItem(
            id=request_id, method="", service="", priority=0, producer=None,
            created_ms=created_ms, age_s=age_s, body_bytes=size, error=str(exc)[:200],
        )  # fmt: skip
    return QueuedItem(
        id=request_id, method=request.method, service=request.service,
        priority=request.priority, producer=request.producer, created_ms=created_ms,
        age_s=age_s, body_bytes=size, error=None,
    )  # fmt: skip


def _stored_limit(endpoint: str, field: str, value: Any) -> int | None:
    """A limit as the limits hash stores it: None when unset, and None (with a warning) when
    it is not an integer within 1..MAX_LIMIT: prq never writes such a value, and the scripts
    apply no limit for it either (their `limit` guard), but an operator should look at it."""
    if value is None:
        return None
    text = _text(value)
    if text.isascii() and text.isdigit() and 1 <= int(text) <= MAX_LIMIT:
        return int(text)
    logger.warning(
        "malformed stored limit endpoint=%r field=%s value=%r (shown as no limit)",
        endpoint,
        field,
        text[:50],
    )
    return None


def _pairs(reply: Any) -> list[tuple[Any, Any]]:
    """(member, score) pairs of a WITHSCORES reply: pairs in RESP3, a flat list in RESP2."""
    items = list(reply or [])
    if items and isinstance(items[0], (list, tuple)):
        return [(member, score) for member, score in items]
    return list(zip(items[::2], items[1::2], strict=False))


def _either_form(hashed: Any, strung: Any, names: Sequence[str]) -> list[Any]:
    """The fields `names` of a record read both ways (HMGET of them, and GETRANGE of its head):
    the hash's, or the queued-form string's (prq.core.records), or all None for no record."""
    if isinstance(hashed, list):
        return hashed
    if isinstance(strung, bytes):
        fields = queued_head(strung) or {"st": b"queued"}  # damaged: still queued
        return [fields.get(name) for name in names]
    _raise_unless_wrongtype(hashed, strung)
    return [None] * len(names)


def _raise_unless_wrongtype(*replies: Any) -> None:
    """Raise the first error among these replies, except WRONGTYPE: a record read both ways
    answers it for the form it is not in."""
    for reply in replies:
        if isinstance(reply, Exception) and not str(reply).startswith("WRONGTYPE"):
            raise reply


def _server_ms(reply: Any) -> int:
    """Redis TIME as ms since the epoch (redis-py answers a (seconds, microseconds) tuple)."""
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return "" if value is None else str(value)
