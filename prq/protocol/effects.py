"""Aliases and Protocols shared by the modules (never a module named typing.py): the effects a
flow yields (`Exec` of `Call`s, `Wait`, `Offload`), the raw `Reply`, and the `Script` a call
may run. It imports nothing of the protocol: the scripts' builders (prq.protocol.scripts) and
the flows build on it, never the other way round."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeAlias, TypeVar

from pydantic import JsonValue

from prq.core.errors import SerializationError

if TYPE_CHECKING:
    from prq.core.models import Request

#: A raw reply as redis-py hands it over (bytes, ints, lists of those, None, or an error).
Reply: TypeAlias = bytes | str | int | float | list["Reply"] | Exception | None

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Call:
    """One Redis command, ready to send. `script` is set for EVALSHA calls; `resend`, for a
    call that must be sent as another on every attempt after its first (`attempt_calls`)."""

    args: tuple[str | int | bytes, ...]
    script: Script | None = None
    resend: Resend | None = field(default=None, compare=False)


@dataclass(eq=False, slots=True)
class Resend:
    """What a call is sent as once it was sent: `call`, on every later attempt of its step (a
    retry after a lost reply, whichever sender makes it). For a script that must know an
    earlier attempt may have run: an enqueue sent again after Redis lost data may be a
    replay of one whose record the loss took (enqueue.lua)."""

    call: Call
    sent: bool = False


def attempt_calls(calls: Iterable[Call]) -> list[Call]:
    """The calls to send on an attempt of `calls` (every sender of a step's attempts calls
    this once per attempt): a call with a `resend` is itself the first time, its resend from
    then on."""
    out: list[Call] = []
    for call in calls:
        again = call.resend
        if again is None:
            out.append(call)
        elif again.sent:
            out.append(again.call)
        else:
            again.sent = True
            out.append(call)
    return out


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua script, identified by the SHA1 of its source (read from its file by
    prq.protocol.scripts.loading)."""

    name: str
    source: str
    sha: str

    def call(self, keys: tuple[str, ...], args: tuple[str | int | bytes, ...]) -> Call:
        return Call(("EVALSHA", self.sha, len(keys), *keys, *args), self)


@dataclass(frozen=True, slots=True)
class Exec:
    """Effect: send these calls in one round trip (retried as a whole); yields their replies.
    `express`: the blocking facade may send them beside the batch in flight instead of behind
    it (a take that does not park, sent while work waits: it should not wait for answers)."""

    calls: tuple[Call, ...]
    express: bool = False


def first_reply(replies: object) -> Reply:
    """The first reply of an Exec's replies."""
    assert isinstance(replies, list)
    reply: Reply = replies[0]
    return reply


def reply_list(reply: Reply) -> list[Reply]:
    """An array reply; anything else is a SerializationError (not what prq's calls answer)."""
    if not isinstance(reply, list):
        raise SerializationError(f"unexpected reply from Redis: {reply!r:.200}")
    return reply


def reply_text(value: Reply) -> str:
    """A reply as text (invalid UTF-8 replaced; None is empty)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return "" if value is None else str(value)


class Waitable(Protocol):
    """Something a flow can wait on: a pulse signal with a generation counter and the payload
    of its last pulse."""

    @property
    def generation(self) -> int: ...

    @property
    def payload(self) -> bytes | None: ...


@dataclass(frozen=True, slots=True)
class Wait:
    """Effect: wait until `signal` moves past generation `seen`, or `timeout_s` passes."""

    signal: Waitable
    seen: int
    timeout_s: float


@dataclass(frozen=True, slots=True)
class Offload:
    """Effect: run `work` (blocking I/O: the DataStream store's files) where it cannot stall
    the event loop (a thread, for AsyncQueue); yields what it returns. A PrqError it raises is
    thrown into the flow."""

    work: Callable[[], object]


Effect: TypeAlias = Exec | Wait | Offload
#: A protocol flow: a generator that yields effects, receives their results, returns T.
Flow: TypeAlias = Generator[Effect, object, T]


class SyncHandler(Protocol):
    """A service handler that runs in a worker thread."""

    def __call__(self, request: Request, /) -> JsonValue: ...


class AsyncHandler(Protocol):
    """A service handler that runs on the event loop."""

    def __call__(self, request: Request, /) -> Awaitable[JsonValue]: ...


Handler: TypeAlias = SyncHandler | AsyncHandler | Callable[["Request"], object]
