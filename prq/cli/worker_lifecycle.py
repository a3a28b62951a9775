"""The `prq worker` process's lifecycle: connect, serve every endpoint on one node (AsyncQueue
on one event loop, or Queue with threads), stop on the first SIGINT/SIGTERM and let held
requests finish, give back what still runs at the shutdown timeout or a second signal. The
command's options and its module docstring (prq.cli.worker) say what an operator sees.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType

import typer

from prq.cli.options import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    error_line,
    exit_code_for,
    fail,
    redact_url,
)
from prq.core.config import QueueSettings, RedisSettings
from prq.core.errors import PrqError
from prq.datastreams import store_from_env
from prq.facade.asyncio_queue import AsyncQueue
from prq.facade.blocking_queue import Queue
from prq.protocol.effects import Handler
from prq.serve.collector import relax_collector

__all__ = ["WorkerConfig", "run_worker"]

#: How often the threaded worker's main thread looks at its serve threads.
DEFAULT_SUPERVISE_S = 0.5

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """What `run_worker` serves, where, and how it stops."""

    url: str
    prefix: str
    handler_name: str
    endpoints: tuple[str, ...]
    concurrency: int
    facade: str  # "async" or "sync"
    shutdown_timeout_s: float
    settings: QueueSettings


def run_worker(config: WorkerConfig, handler: Handler) -> int:
    """Serve until a signal (see the module docstring); returns the exit code."""
    relax_collector()
    try:
        if config.facade == "async":
            return asyncio.run(_serve_async(config, handler))
        return _serve_sync(config, handler)
    except PrqError as exc:  # connecting failed (credentials, permissions, Redis down)
        fail(exc, exit_code_for(exc))
    except ValueError as exc:  # a setting refused when the queue was made
        fail(exc, EXIT_USAGE)


def _say(message: str) -> None:
    """Lifecycle lines go to stderr whatever the log level: an operator waits for them."""
    typer.echo(f"prq worker: {message}", err=True)


def _announce(config: WorkerConfig) -> None:
    _say(
        f"serving {', '.join(config.endpoints)} with {config.handler_name} "
        f"({config.facade}, concurrency {config.concurrency} per endpoint) on "
        f"{redact_url(config.url)} prefix {config.prefix}; stop with Ctrl-C or SIGTERM"
    )


def _stopping(config: WorkerConfig) -> None:
    _say(
        f"stopping: finishing held requests (up to {config.shutdown_timeout_s:g} s; signal "
        "again to abandon them)"
    )


def _abandon(config: WorkerConfig, reason: str) -> None:
    """Exit now, without waiting for handlers that still run (their threads cannot be
    stopped from outside); their requests were given back first (`_give_back`)."""
    _say(
        f"{reason}: abandoning the requests still running; they were given back "
        "(at_least_once: queued again; at_most_once: their callers told ReceiverLost)"
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_FAILED)


async def _serve_async(config: WorkerConfig, handler: Handler) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    force = asyncio.Event()

    def on_signal() -> None:
        (force if stop.is_set() else stop).set()

    for sig in _SIGNALS:
        loop.add_signal_handler(sig, on_signal)
    redis_settings = RedisSettings.from_url(config.url)
    async with AsyncQueue(
        redis_settings, prefix=config.prefix, settings=config.settings,
        datastreams=store_from_env(),
    ) as queue:  # fmt: skip
        servers = [
            asyncio.create_task(
                queue.serve(e, handler, concurrency=config.concurrency, stop=stop),
                name=f"prq-serve-{e}",
            )
            for e in config.endpoints
        ]
        _announce(config)
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait([*servers, stopped], return_when=asyncio.FIRST_COMPLETED)
        code = _failed_servers(servers)
        stop.set()
        stopped.cancel()
        _stopping(config)
        forced = asyncio.create_task(force.wait())
        deadline = loop.time() + config.shutdown_timeout_s
        pending = {task for task in servers if not task.done()}
        while pending and not force.is_set() and loop.time() < deadline:
            await asyncio.wait(
                [*pending, forced],
                timeout=deadline - loop.time(),
                return_when=asyncio.FIRST_COMPLETED,
            )
            pending = {task for task in servers if not task.done()}
        forced.cancel()
        if pending:
            await queue.aclose(shutdown_timeout_s=0)  # gives back what the handlers hold
            _abandon(config, "signalled again" if force.is_set() else "shutdown timeout")
        code = max(code, _failed_servers(servers))
    _say("stopped")
    return code


def _failed_servers(servers: Sequence[asyncio.Task[None]]) -> int:
    code = EXIT_OK
    for task in servers:
        error = task.exception() if task.done() and not task.cancelled() else None
        if error is not None:
            _say(f"serve loop {task.get_name()} failed: {error_line(error)}")
            code = EXIT_FAILED
    return code


def _serve_sync(config: WorkerConfig, handler: Handler) -> int:
    stop = threading.Event()
    force = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        (force if stop.is_set() else stop).set()

    previous = {sig: signal.signal(sig, on_signal) for sig in _SIGNALS}
    try:
        return _serve_threads(config, handler, stop, force)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _serve_threads(
    config: WorkerConfig, handler: Handler, stop: threading.Event, force: threading.Event
) -> int:
    errors: list[BaseException] = []

    def serve(queue: Queue, endpoint: str) -> None:
        try:
            queue.serve(endpoint, handler, concurrency=config.concurrency, stop=stop)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            stop.set()

    redis_settings = RedisSettings.from_url(config.url)
    with Queue(
        redis_settings, prefix=config.prefix, settings=config.settings,
        datastreams=store_from_env(),
    ) as queue:  # fmt: skip
        threads = [
            threading.Thread(target=serve, args=(queue, e), name=f"prq-serve-{e}", daemon=True)
            for e in config.endpoints
        ]
        for thread in threads:
            thread.start()
        _announce(config)
        while not stop.wait(DEFAULT_SUPERVISE_S) and all(t.is_alive() for t in threads):
            pass
        stop.set()
        _stopping(config)
        deadline = time.monotonic() + config.shutdown_timeout_s
        for thread in threads:
            while thread.is_alive() and not force.is_set() and time.monotonic() < deadline:
                thread.join(min(DEFAULT_SUPERVISE_S, max(0.0, deadline - time.monotonic())))
        if any(thread.is_alive() for thread in threads):
            queue.close(shutdown_timeout_s=0)  # gives back what the handlers hold
            _abandon(config, "signalled again" if force.is_set() else "shutdown timeout")
    for exc in errors:
        _say(f"a serve loop failed: {error_line(exc)}")
    _say("stopped")
    return EXIT_FAILED if errors else EXIT_OK
