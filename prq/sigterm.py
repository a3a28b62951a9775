"""A `serve` that owns the main thread stops gracefully on SIGTERM.

SIGTERM is how docker, systemd and Kubernetes stop a process. Its default action kills the
process at once: the requests it holds are lost to their callers until the receiver timeout,
and a take parked at that moment stays parked in Redis. So while `Queue.serve` or
`AsyncQueue.serve` runs in the main thread with no `stop` of the caller's and SIGTERM still has
its default action, SIGTERM sets the serve loop's stop instead: it takes nothing new, finishes
what it holds, and returns; closing the queue then gives back whatever is left. A handler that
the application installed itself is left alone, and so are serve loops in other threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator

__all__ = ["stop_on_sigterm", "stop_on_sigterm_async"]

logger = logging.getLogger(__name__)


def _ours() -> bool:
    """Whether SIGTERM is ours to take: main thread, and the default action still in place."""
    return (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    )


def _stopping(set_stop: Callable[[], None]) -> Callable[[], None]:
    def on_sigterm() -> None:
        logger.warning("SIGTERM: serve stops taking requests and finishes the ones it holds")
        set_stop()

    return on_sigterm


@contextlib.contextmanager
def stop_on_sigterm(stop: threading.Event) -> Iterator[None]:
    """While the block runs, SIGTERM sets `stop` (when SIGTERM is ours to take, see above)."""
    if not _ours():
        yield
        return
    on_sigterm = _stopping(stop.set)
    signal.signal(signal.SIGTERM, lambda _signum, _frame: on_sigterm())
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def stop_on_sigterm_async(stop: asyncio.Event) -> Iterator[None]:
    """The same for a serve loop on the running event loop (`loop.add_signal_handler`)."""
    if not _ours():
        yield
        return
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGTERM, _stopping(stop.set))
    except (NotImplementedError, RuntimeError):  # a loop without signal support
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
