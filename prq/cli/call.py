"""`prq call`: send requests through the queue and print what comes back.

One call prints its result as JSON on stdout. `--count N` sends N calls (`--inflight` at a
time, each on its own thread of one `Queue`), shows a progress bar on stderr, and prints a JSON
summary on stdout instead. Failures print `error: <Type>: message` on stderr; the exit code
says whether trying again may help (see prq.cli.options).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Annotated, Any

import typer
from pydantic import JsonValue
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from prq.cli.options import (
    DEFAULT_PREFIX,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_RETRYABLE,
    PrefixOption,
    SharedUrlOption,
    error_line,
    exit_code_for,
    fail,
    queue_settings,
    reporting,
    shared_redis,
)
from prq.core.config import QueueSettings
from prq.core.defaults import DEFAULT_PICKUP_TIMEOUT_S
from prq.core.errors import InvalidEndpoint, PrqError, RemoteError
from prq.core.models import Request
from prq.core.names import validate_endpoint
from prq.datastreams import store_from_env
from prq.demo.stats import percentile
from prq.facade.blocking_queue import Queue

__all__ = [
    "DEFAULT_CALL_TIMEOUT_S",
    "CallSummary",
    "call",
    "exit_code_for",
    "parse_params",
    "pickup_timeout_s",
]

#: How long one call waits for its response, unless told otherwise.
DEFAULT_CALL_TIMEOUT_S = 60.0
#: How long an interrupted single call may take to withdraw its request.
DEFAULT_WITHDRAW_TIMEOUT_S = 5.0


def call(
    endpoint: Annotated[
        str,
        typer.Argument(
            metavar="ENDPOINT", help="Endpoint to call, e.g. poll://billing-1.", show_default=False
        ),
    ],
    method: Annotated[
        str, typer.Argument(metavar="METHOD", help="Method name, e.g. sum.", show_default=False)
    ],
    params: Annotated[
        str | None,
        typer.Argument(
            metavar="PARAMS_JSON",
            help='Parameters as JSON, e.g. \'{"values": [1, 2]}\'; "-" reads them from stdin; '
            "omitted: null.",
            show_default=False,
        ),
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            envvar="PRQ_CALL_TIMEOUT_S",
            show_envvar=True,
            min=0,
            help="Seconds to wait for each response (CallTimeout after); 0: as long as the "
            "receiver lives.",
        ),
    ] = DEFAULT_CALL_TIMEOUT_S,
    pickup_timeout: Annotated[
        float | None,
        typer.Option(
            "--pickup-timeout",
            envvar="PRQ_PICKUP_TIMEOUT_S",
            show_envvar=True,
            min=0.001,
            show_default=False,
            help="Seconds a request may wait for a receiver to pick it up (PickupTimeout "
            "after; the request is withdrawn and never runs). Default: the queue's "
            f"pickup_timeout_s ({DEFAULT_PICKUP_TIMEOUT_S:g}).",
        ),
    ] = None,
    count: Annotated[
        int,
        typer.Option(
            "--count",
            "-n",
            envvar="PRQ_CALL_COUNT",
            show_envvar=True,
            min=1,
            help="Send this many calls; above 1, show a progress bar and print a JSON "
            "summary (calls, ok, errors by type, p50/p99 ms, calls/s) instead of results.",
        ),
    ] = 1,
    inflight: Annotated[
        int,
        typer.Option(
            "--inflight",
            envvar="PRQ_CALL_INFLIGHT",
            show_envvar=True,
            min=1,
            max=1024,
            help="With --count: calls in flight at once.",
        ),
    ] = 1,
    url: SharedUrlOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
) -> None:
    """Call METHOD on ENDPOINT with PARAMS_JSON and print the result as JSON.

    Exit code: 0 done; 1 failed (the service raised, or the request was cancelled); 3 failed
    in a way that trying again may succeed (PickupTimeout, CallTimeout, ReceiverLost,
    QueueUnavailable: Redis did not answer, ...); 2 usage error (a Redis URL prq cannot use,
    too); 130 Ctrl-C. Errors print as `error: <Type>: message` on stderr: Redis refusing the
    credentials is `error: ConfigurationError: ...` (exit 1).
    """
    redis_settings = shared_redis(url, "call")
    try:
        validate_endpoint(endpoint)
    except InvalidEndpoint as exc:
        raise typer.BadParameter(str(exc), param_hint="ENDPOINT") from exc
    value = parse_params(params)
    settings = queue_settings()
    with reporting():
        queue = Queue(
            redis_settings,
            prefix=prefix,
            settings=settings,
            datastreams=store_from_env(),  # large bodies both ways (prq.core.bodies)
        )
    target = _Target(
        endpoint, method, value, timeout or None, pickup_timeout_s(pickup_timeout, settings)
    )
    with reporting(), queue:  # connecting failed (credentials, permissions, Redis down)
        if count == 1:
            code = _call_once(queue, target)
        else:
            code = _call_many(queue, target, count, inflight)
    raise typer.Exit(code)


def parse_params(text: str | None) -> JsonValue:
    """PARAMS_JSON as a JSON value (None when omitted); typer.BadParameter when it is not JSON."""
    if text is None:
        return None
    if text == "-":
        text = sys.stdin.read()

    def reject(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        value: JsonValue = json.loads(text, parse_constant=reject)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(
            f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); quote it "
            """for the shell, e.g. '{"values": [1, 2]}' or '"text"'""",
            param_hint="PARAMS_JSON",
        ) from exc
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="PARAMS_JSON") from exc
    return value


def pickup_timeout_s(flag: float | None, settings: QueueSettings) -> float:
    """`--pickup-timeout` (or PRQ_PICKUP_TIMEOUT_S, which click reads into it), else the
    queue's own `pickup_timeout_s`: the one setting a library caller would get too."""
    return settings.pickup_timeout_s if flag is None else flag


@dataclass(frozen=True, slots=True)
class _Target:
    endpoint: str
    method: str
    params: JsonValue
    timeout_s: float | None
    pickup_timeout_s: float


def _send(queue: Queue, target: _Target, request: Request | None = None) -> JsonValue:
    """One call; its result, or the PrqError it failed with (RemoteError for a service error)."""
    if request is None:
        request = queue.build_request(target.endpoint, target.method, target.params)
    response = queue.queue_and_wait(
        request, pickup_timeout_s=target.pickup_timeout_s, timeout_s=target.timeout_s
    )
    if response.error is not None:
        raise RemoteError(response.error, request_id=request.id, endpoint=request.endpoint)
    return response.result


def _call_once(queue: Queue, target: _Target) -> int:
    request: Request | None = None
    try:
        request = queue.build_request(target.endpoint, target.method, target.params)
        result = _send(queue, target, request)
    except PrqError as exc:
        fail(exc, exit_code_for(exc))
    except KeyboardInterrupt:
        _withdraw(queue, request)
        typer.echo("error: interrupted; the request was cancelled", err=True)
        return EXIT_INTERRUPTED
    typer.echo(json.dumps(result, ensure_ascii=False))
    return EXIT_OK


def _withdraw(queue: Queue, request: Request | None) -> None:
    """Ctrl-C: do not leave the request to run for nobody (best effort, bounded)."""
    if request is None:
        return
    worker = threading.Thread(target=_cancel_quietly, args=(queue, request.id), daemon=True)
    worker.start()
    worker.join(DEFAULT_WITHDRAW_TIMEOUT_S)


def _cancel_quietly(queue: Queue, request_id: str) -> None:
    try:
        queue.cancel(request_id)
    except PrqError as exc:
        typer.echo(f"could not cancel request {request_id}: {error_line(exc)}", err=True)


# -- many calls -----------------------------------------------------------------------------------


@dataclass
class CallSummary:
    """What `--count` calls came to."""

    calls: int = 0
    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    retryable_failures: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    first_error: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, latency_ms: float, error: PrqError | None) -> None:
        with self._lock:
            self.calls += 1
            if error is None:
                self.ok += 1
                self.latencies_ms.append(latency_ms)
                return
            self.errors[type(error).__name__] += 1
            self.retryable_failures += 1 if error.retryable else 0
            if self.first_error is None:
                self.first_error = error_line(error)

    def exit_code(self) -> int:
        failed = self.calls - self.ok
        if failed == 0:
            return EXIT_OK
        return EXIT_RETRYABLE if self.retryable_failures == failed else EXIT_FAILED

    def to_json(self) -> dict[str, JsonValue]:
        latencies = sorted(self.latencies_ms)
        rate = self.calls / self.elapsed_s if self.elapsed_s > 0 else 0.0
        return {
            "calls": self.calls,
            "ok": self.ok,
            "failed": self.calls - self.ok,
            "errors": dict(sorted(self.errors.items())),
            "first_error": self.first_error,
            "elapsed_s": round(self.elapsed_s, 3),
            "calls_per_s": round(rate, 1),
            "p50_ms": _round(percentile(latencies, 0.50)),
            "p99_ms": _round(percentile(latencies, 0.99)),
            "max_ms": _round(latencies[-1] if latencies else None),
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _call_many(queue: Queue, target: _Target, count: int, inflight: int) -> int:
    summary = CallSummary()
    console = Console(stderr=True)
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not console.is_terminal,
    )
    next_call = iter(range(count))
    take_lock = threading.Lock()
    stopping = threading.Event()

    def sender(task: Any) -> None:
        while not stopping.is_set():
            with take_lock:
                if next(next_call, None) is None:
                    return
            started = time.perf_counter()
            try:
                _send(queue, target)
                error = None
            except PrqError as exc:
                error = exc
            summary.record((time.perf_counter() - started) * 1000, error)
            progress.advance(task)

    started = time.perf_counter()
    interrupted = False
    with progress:
        task = progress.add_task(f"{target.endpoint} {target.method}", total=count)
        threads = [
            threading.Thread(target=sender, args=(task,), name=f"prq-call-{n}", daemon=True)
            for n in range(min(inflight, count))
        ]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.2)
        except KeyboardInterrupt:
            # Calls in flight finish (each is bounded by its own timeouts); no new one starts.
            interrupted = True
            stopping.set()
            for thread in threads:
                thread.join()
    summary.elapsed_s = time.perf_counter() - started
    typer.echo(json.dumps(summary.to_json(), indent=2))
    if summary.first_error is not None:
        typer.echo(summary.first_error, err=True)
    return EXIT_INTERRUPTED if interrupted else summary.exit_code()
