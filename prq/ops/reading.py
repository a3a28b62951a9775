"""How the Inspector reads: the state its views share (`InspectorBase`), the driver of
protocol flows that only read (`_read_flows`), prq's error for a Redis that does not answer
(`_reading`), and the decoding of replies every view needs (TIME, text, WRONGTYPE).

The views (prq.ops.endpoint_view, queue_view, redis_view) build on this; it imports none of them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import redis.asyncio

from prq.core.config import QueueSettings
from prq.core.errors import QueueUnavailable
from prq.core.keys import KeySchema
from prq.protocol.effects import Exec, Flow
from prq.transport.translate import RedisUnavailable, translate_errors

__all__ = ["InspectorBase"]

T = TypeVar("T")

#: The only commands a flow driven by the Inspector may send (see `_read_flows`).
_FLOW_READS = frozenset(
    {"ZRANGE", "ZCARD", "ZCOUNT", "HMGET", "HSTRLEN", "GET", "GETRANGE", "LRANGE"}
)


class InspectorBase:
    """What every view of the Inspector reads with: its client, key prefix, settings and cap
    on listed endpoints (set by `Inspector.__init__`), and `_read_flows`."""

    client: redis.asyncio.Redis
    keys: KeySchema
    settings: QueueSettings
    max_endpoints: int

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


@contextlib.contextmanager
def _reading() -> Iterator[None]:
    """prq's errors for a read: QueueUnavailable when Redis does not answer (not retried: an
    operator's view should say so at once)."""
    try:
        with translate_errors():
            yield
    except RedisUnavailable as exc:
        raise QueueUnavailable(f"Redis did not answer: {exc}") from exc


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
