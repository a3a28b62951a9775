"""Aliases and Protocols shared by the modules (never a module named typing.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeAlias, TypeVar

from pydantic import JsonValue

if TYPE_CHECKING:
    from prq.models import Request
    from prq.scripts import Script

#: A raw reply as redis-py hands it over (bytes, ints, lists of those, None, or an error).
Reply: TypeAlias = bytes | str | int | float | list["Reply"] | Exception | None

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Call:
    """One Redis command, ready to send. `script` is set for EVALSHA calls."""

    args: tuple[str | int | bytes, ...]
    script: Script | None = None


@dataclass(frozen=True, slots=True)
class Exec:
    """Effect: send these calls in one round trip (retried as a whole); yields their replies."""

    calls: tuple[Call, ...]


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


Effect: TypeAlias = Exec | Wait
#: A protocol flow: a generator that yields effects, receives their results, returns T.
Flow: TypeAlias = Generator[Effect, object, T]


class SyncHandler(Protocol):
    """A service handler that runs in a worker thread."""

    def __call__(self, request: Request, /) -> JsonValue: ...


class AsyncHandler(Protocol):
    """A service handler that runs on the event loop."""

    def __call__(self, request: Request, /) -> Awaitable[JsonValue]: ...


Handler: TypeAlias = SyncHandler | AsyncHandler | Callable[["Request"], object]
