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

The handler's import lives in prq.cli.worker_handler, the process's lifecycle in
prq.cli.worker_lifecycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import typer
from prometheus_client import start_http_server

from prq.cli.options import (
    DEFAULT_PREFIX,
    EXIT_USAGE,
    PrefixOption,
    SharedUrlOption,
    fail,
    queue_settings,
    shared_redis,
)
from prq.cli.worker_handler import is_coroutine_handler, load_handler
from prq.cli.worker_lifecycle import WorkerConfig, _say, run_worker
from prq.core.errors import InvalidEndpoint
from prq.core.names import validate_endpoint

__all__ = ["DEFAULT_SHUTDOWN_TIMEOUT_S", "worker"]

#: How long a stopping worker lets its held requests finish before abandoning them.
DEFAULT_SHUTDOWN_TIMEOUT_S = 10.0


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
    redis_url = shared_redis(url, "worker").url
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
