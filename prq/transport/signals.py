"""Signals: what a wait listens to for a pulse.

A signal's `generation` grows each time it fires, so a wait that read the generation before it
polled Redis misses no fire that came meanwhile. `AsyncSignal` is awaited on the event loop,
`ThreadSignal` by threads; both are fired by the pub/sub reader (prq.transport.pulses) through
the router (prq.transport.pulse_router). A signal is only a hint: every wait also polls.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TypeVar

__all__ = ["AsyncSignal", "Signal", "ThreadSignal"]


class Signal:
    """A pulse target: `generation` grows on every fire; `payload` holds the last message."""

    __slots__ = ("generation", "payload")

    def __init__(self) -> None:
        self.generation = 0
        self.payload: bytes | None = None

    def fire(self, payload: bytes | None = None) -> None:
        self.generation += 1
        self.payload = payload
        self._wake()

    def _wake(self) -> None:
        raise NotImplementedError


class AsyncSignal(Signal):
    """A signal awaited on the event loop (fired from the same loop). A wait is one future and
    one timer handle: it runs once per call, so it avoids asyncio.Event and asyncio.timeout,
    which cost several times that."""

    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        super().__init__()
        self._waiters: list[asyncio.Future[None]] = []

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            _release(waiter)

    async def wait(self, seen: int, timeout_s: float) -> None:
        """Return once the generation moved past `seen`, or after `timeout_s`."""
        if self.generation != seen or timeout_s <= 0:
            return
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        timer = loop.call_later(timeout_s, _release, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            if waiter in self._waiters:  # timed out or cancelled: not woken
                self._waiters.remove(waiter)


def _release(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class ThreadSignal(Signal):
    """A signal waited on by threads (fired from the reader thread)."""

    __slots__ = ("_cond",)

    def __init__(self) -> None:
        super().__init__()
        self._cond = threading.Condition()

    def fire(self, payload: bytes | None = None) -> None:
        with self._cond:
            super().fire(payload)

    def _wake(self) -> None:
        self._cond.notify_all()

    def wait(self, seen: int, timeout_s: float) -> None:
        """Return once the generation moved past `seen`, or after `timeout_s`."""
        with self._cond:
            self._cond.wait_for(lambda: self.generation != seen, timeout_s)


S = TypeVar("S", bound=Signal)
