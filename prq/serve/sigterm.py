"""A `serve` that owns the main thread stops gracefully on SIGTERM, and on a first Ctrl-C.

SIGTERM is how docker, systemd and Kubernetes stop a process. Its default action kills the
process at once: the requests it holds are lost to their callers until the receiver timeout,
and a take parked at that moment stays parked in Redis. So while `Queue.serve` or
`AsyncQueue.serve` runs in the main thread with no `stop` of the caller's and SIGTERM still has
its default action, SIGTERM sets the serve loop's stop instead: it takes nothing new, finishes
what it holds, and returns; closing the queue then gives back whatever is left.

Ctrl-C (SIGINT) does the same the first time, when it still has Python's own action
(KeyboardInterrupt, or asyncio.run's, which cancels the main task): the serve returns and the
program ends without a traceback. The first Ctrl-C gives SIGINT its action back, so a second
one interrupts at once, as it would have without prq.

A handler that the application installed itself is left alone, and so are serve loops in
other threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

__all__ = ["stop_on_sigterm", "stop_on_sigterm_async"]

logger = logging.getLogger(__name__)

_Action = Callable[[int, FrameType | None], Any] | int | None


def _sigterm_ours() -> bool:
    """Whether SIGTERM is ours to take: main thread, and the default action still in place."""
    return (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    )


def _sigint_ours() -> bool:
    """Whether SIGINT is ours to take: main thread, and Python's (or asyncio.run's) action."""
    if threading.current_thread() is not threading.main_thread():
        return False
    action = signal.getsignal(signal.SIGINT)
    runner = getattr(getattr(action, "func", None), "__qualname__", "")
    return action is signal.default_int_handler or runner == "Runner._on_sigint"


def _stopping(name: str, set_stop: Callable[[], None]) -> Callable[[], None]:
    def on_signal() -> None:
        logger.warning("%s: serve stops taking requests and finishes the ones it holds", name)
        set_stop()

    return on_signal


@contextlib.contextmanager
def stop_on_sigterm(stop: threading.Event) -> Iterator[None]:
    """While the block runs, SIGTERM and a first SIGINT set `stop` (when they are ours to
    take, see above)."""
    with contextlib.ExitStack() as stack:
        if _sigterm_ours():
            on_sigterm = _stopping("SIGTERM", stop.set)
            signal.signal(signal.SIGTERM, lambda _signum, _frame: on_sigterm())
            stack.callback(signal.signal, signal.SIGTERM, signal.SIG_DFL)
        if _sigint_ours():
            stack.enter_context(_first_sigint(stop.set))
        yield


@contextlib.contextmanager
def _first_sigint(set_stop: Callable[[], None]) -> Iterator[None]:
    previous: _Action = signal.getsignal(signal.SIGINT)
    on_sigint = _stopping("SIGINT (Ctrl-C; again to interrupt at once)", set_stop)

    def handle(_signum: int, _frame: FrameType | None) -> None:
        signal.signal(signal.SIGINT, previous)
        on_sigint()

    signal.signal(signal.SIGINT, handle)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is handle:
            signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def stop_on_sigterm_async(stop: asyncio.Event) -> Iterator[None]:
    """The same for a serve loop on the running event loop (`loop.add_signal_handler`)."""
    loop = asyncio.get_running_loop()
    with contextlib.ExitStack() as stack:
        if _sigterm_ours() and _add(loop, signal.SIGTERM, _stopping("SIGTERM", stop.set)):
            stack.callback(loop.remove_signal_handler, signal.SIGTERM)
        if _sigint_ours():
            previous: _Action = signal.getsignal(signal.SIGINT)
            on_sigint = _stopping("SIGINT (Ctrl-C; again to interrupt at once)", stop.set)
            handled: list[bool] = []

            def first_sigint() -> None:
                handled.append(True)
                _give_back_sigint(loop, previous)
                on_sigint()

            def leave() -> None:
                if not handled:
                    _give_back_sigint(loop, previous)

            if _add(loop, signal.SIGINT, first_sigint):
                stack.callback(leave)
        yield


def _add(loop: asyncio.AbstractEventLoop, signum: int, callback: Callable[[], None]) -> bool:
    try:
        loop.add_signal_handler(signum, callback)
    except (NotImplementedError, RuntimeError):  # a loop without signal support
        return False
    return True


def _give_back_sigint(loop: asyncio.AbstractEventLoop, previous: _Action) -> None:
    loop.remove_signal_handler(signal.SIGINT)  # (which sets Python's default_int_handler)
    signal.signal(signal.SIGINT, previous)
