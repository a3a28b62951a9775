"""`prq worker`: serve endpoints with a handler imported by name, until SIGINT or SIGTERM.

Which facade serves the handler:
- a coroutine function (or an object whose `__call__` is one) is served by `AsyncQueue.serve`
  on one event loop: its requests run concurrently as tasks, and a handler that blocks would
  stall them all;
- anything else by `Queue.serve`: `concurrency` threads per endpoint, each a take → handle →
  respond loop, so a blocking handler holds up only its own thread and no request crosses a
  thread between its pulse and its handler.
`--async` / `--sync` override the choice (AsyncQueue.serve runs a plain function in a thread
pool; Queue.serve runs a coroutine function to completion on each call).

Lifecycle: pace the garbage collector for serving (prq.serve.collector) → import the handler (usage
error if it does not import or is not callable) → connect → serve every endpoint on one node →
the first SIGINT/SIGTERM stops taking requests
and lets the held ones finish for up to `shutdown_timeout_s` → exit 0. A second signal, or
the timeout, gives back what still runs (at_least_once requests are queued again, callers of
at_most_once ones get ReceiverLost at once), abandons those handlers and exits 1.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Annotated

import typer
from prometheus_client import start_http_server

from prq.cli.options import (
    DEFAULT_PREFIX,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    PrefixOption,
    SharedUrlOption,
    error_line,
    fail,
    queue_settings,
    redact_url,
    require_url,
)
from prq.core.config import QueueSettings, RedisSettings
from prq.core.errors import InvalidEndpoint, PrqError
from prq.core.names import validate_endpoint
from prq.datastreams import store_from_env
from prq.facade.asyncio_queue import AsyncQueue
from prq.facade.blocking_queue import Queue
from prq.protocol.effects import Handler
from prq.serve.collector import relax_collector

__all__ = [
    "DEFAULT_SHUTDOWN_TIMEOUT_S",
    "WorkerConfig",
    "is_coroutine_handler",
    "load_handler",
    "run_worker",
    "worker",
]

#: How long a stopping worker lets its held requests finish before abandoning them.
DEFAULT_SHUTDOWN_TIMEOUT_S = 10.0
#: How often the threaded worker's main thread looks at its serve threads.
DEFAULT_SUPERVISE_S = 0.5

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def worker(
    handler: Annotated[
        str,
        typer.Argument(
            metavar="MODULE:FUNCTION",
            envvar="PRQ_WORKER_HANDLER",
            show_envvar=True,
            show_default=False,
            help="The handler: a function taking a prq Request and returning JSON, named "
            "as module:function (e.g. myapp.handlers:lookup). The current directory is "
            "importable.",
        ),
    ],
    endpoint: Annotated[
        list[str] | None,
        typer.Option(
            "--endpoint",
            "-e",
            envvar="PRQ_WORKER_ENDPOINTS",
            show_envvar=True,
            show_default=False,
            help="Endpoint to serve, e.g. poll://billing-1; repeat for more (in the "
            "variable: separated by spaces). Required.",
        ),
    ] = None,
    concurrency: Annotated[
        int,
        typer.Option(
            "--concurrency",
            "-c",
            envvar="PRQ_WORKER_CONCURRENCY",
            show_envvar=True,
            min=1,
            help="Requests handled at once, per endpoint.",
        ),
    ] = 1,
    sync: Annotated[
        bool | None,
        typer.Option(
            "--sync/--async",
            envvar="PRQ_WORKER_SYNC",
            show_envvar=True,
            show_default=False,
            help="Serve with Queue.serve (threads) or AsyncQueue.serve (one event loop). "
            "Default: async for a coroutine function, threads for a plain function.",
        ),
    ] = None,
    shutdown_timeout: Annotated[
        float,
        typer.Option(
            "--shutdown-timeout",
            envvar="PRQ_WORKER_SHUTDOWN_TIMEOUT_S",
            show_envvar=True,
            min=0,
            help="On SIGINT/SIGTERM, seconds to let held requests finish (the worker then "
            "exits 0); those still running after it, or at a second signal, are given back "
            "and the worker exits 1. Shorter than QueueSettings.shutdown_timeout_s (30 s) so "
            "that the worker ends inside a container's usual 30 s grace period.",
        ),
    ] = DEFAULT_SHUTDOWN_TIMEOUT_S,
    metrics_port: Annotated[
        int,
        typer.Option(
            "--metrics-port",
            envvar="PRQ_WORKER_METRICS_PORT",
            show_envvar=True,
            min=0,
            max=65535,
            help="Serve this process's Prometheus metrics (prq_taken_total, "
            "prq_pickup_wait_seconds, ...) at http://HOST:PORT/metrics; 0: off.",
        ),
    ] = 0,
    metrics_host: Annotated[
        str,
        typer.Option(
            "--metrics-host",
            envvar="PRQ_WORKER_METRICS_HOST",
            show_envvar=True,
            help="Address the metrics endpoint listens on.",
        ),
    ] = "127.0.0.1",
    url: SharedUrlOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
) -> None:
    """Serve endpoints with a handler function until SIGINT or SIGTERM.

    The handler gets each request (`request.method`, `request.params`) and returns a JSON
    value; what it raises reaches the caller as a RemoteError. A coroutine function is served
    on one event loop (AsyncQueue.serve), a plain function by worker threads (Queue.serve).
    On SIGINT/SIGTERM the worker takes no new request, finishes the ones it holds and exits 0;
    if they are not all done within --shutdown-timeout (or a second signal comes), it gives
    the rest back (callers of at_most_once requests get ReceiverLost, at_least_once ones are
    queued again) and exits 1.
    """
    redis_url = require_url(url, "worker")
    endpoints = _endpoints(endpoint or [])
    function = load_handler(handler)
    use_async = (not sync) if sync is not None else is_coroutine_handler(function)
    if metrics_port:
        try:
            start_http_server(metrics_port, addr=metrics_host)
        except OSError as exc:
            fail(exc, EXIT_USAGE)
        _say(f"metrics at http://{metrics_host}:{metrics_port}/metrics")
    config = WorkerConfig(
        url=redis_url,
        prefix=prefix,
        handler_name=handler,
        endpoints=endpoints,
        concurrency=concurrency,
        facade="async" if use_async else "sync",
        shutdown_timeout_s=shutdown_timeout,
        settings=queue_settings(),
    )
    raise typer.Exit(run_worker(config, function))


def _endpoints(given: Sequence[str]) -> tuple[str, ...]:
    if not given:
        raise typer.BadParameter(
            "name at least one endpoint to serve, e.g. --endpoint poll://billing-1",
            param_hint="'--endpoint' / PRQ_WORKER_ENDPOINTS",
        )
    try:
        return tuple(dict.fromkeys(validate_endpoint(e) for e in given))
    except InvalidEndpoint as exc:
        raise typer.BadParameter(str(exc), param_hint="'--endpoint'") from exc


# -- the handler ----------------------------------------------------------------------------------


def load_handler(spec: str) -> Handler:
    """Import `module:attribute[.attribute...]` and return it; typer.BadParameter if it does
    not import, is missing, is not callable, or cannot take one argument (the request)."""
    hint = "MODULE:FUNCTION"
    module_name, sep, attributes = spec.partition(":")
    if not sep or not module_name.strip() or not attributes.strip():
        raise typer.BadParameter(
            f"{spec!r} is not MODULE:FUNCTION, e.g. myapp.handlers:lookup", param_hint=hint
        )
    # Like `python -m` and uvicorn: modules in the current directory can be named (and stay
    # importable while the worker runs: the handler's module may import more lazily).
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: object = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise typer.BadParameter(
                f"no module named {exc.name!r} (looked in the current directory and sys.path)",
                param_hint=hint,
            ) from exc
        raise typer.BadParameter(
            f"importing {module_name!r} failed: {error_line(exc)}", param_hint=hint
        ) from exc
    except Exception as exc:
        raise typer.BadParameter(
            f"importing {module_name!r} failed: {error_line(exc)}", param_hint=hint
        ) from exc
    for name in attributes.split("."):
        try:
            target = getattr(target, name)
        except AttributeError as exc:
            raise typer.BadParameter(f"{spec!r}: no attribute {name!r}", param_hint=hint) from exc
    if not callable(target):
        raise typer.BadParameter(
            f"{spec!r} is a {type(target).__name__}, not a function", param_hint=hint
        )
    _check_takes_one_argument(spec, target)
    return target


def _check_takes_one_argument(spec: str, function: Callable[..., object]) -> None:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return  # some builtins have no signature: let the first call tell
    try:
        signature.bind(object())
    except TypeError as exc:
        raise typer.BadParameter(
            f"{spec!r} must take one argument, the request ({exc})", param_hint="MODULE:FUNCTION"
        ) from exc


def is_coroutine_handler(handler: Handler) -> bool:
    """True for a coroutine function, or an object whose `__call__` is one."""
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(type(handler), "__call__", None)  # noqa: B004  (the class's, not the object's)
    return not inspect.isfunction(handler) and inspect.iscoroutinefunction(call)


# -- serving --------------------------------------------------------------------------------------


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
        fail(exc)
    except ValueError as exc:  # redis-py's verdict on the URL
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
