"""The two roles a fault-bed node process plays (see tests/fault/node_main.py for the contract).

Runs inside the child process only: `run_receiver(config)` and `run_sender(config)` return the
process's exit status.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from prq import (
    AsyncQueue,
    PendingRequest,
    PrqError,
    Queue,
    QueueSettings,
    RedisSettings,
    RemoteError,
    Request,
    Response,
    current_request,
)
from prq.facade.send import BlockingSendHandle, SendHandle
from tests.fault.node_main import (
    EXIT_UNFINISHED,
    SWITCH_POLL_S,
    WATCH_INTERVAL_S,
    JsonlWriter,
    NodeConfig,
    stamp,
    write_ready,
)

__all__ = ["run_receiver", "run_sender"]

#: How long a stopping receiver waits for its handlers, seconds.
RECEIVER_DRAIN_S = 10.0
#: Bound of closing a queue on the way out, seconds.
CLOSE_TIMEOUT_S = 10.0


def _params(request: Request) -> dict[str, Any]:
    return request.params if isinstance(request.params, dict) else {}


def _queue_args(config: NodeConfig) -> tuple[RedisSettings, dict[str, Any]]:
    redis_settings = RedisSettings(url=config.redis_url, **config.redis_settings)
    kwargs = {
        "prefix": config.prefix,
        "settings": QueueSettings(**config.queue_settings),
        "node_id": config.name,
    }
    return redis_settings, kwargs


# -- receiver -----------------------------------------------------------------------------------


class Service:
    """The fake polling service: ledger every execution, then echo (after sleep/block/barrier)."""

    def __init__(self, config: NodeConfig, stopping: threading.Event) -> None:
        self.config = config
        self.stopping = stopping
        self.ledger = JsonlWriter(config.ledger_path, fsync=True)

    def seconds(self, request: Request) -> float:
        """How long a sleeping or blocking handler works on `request`: its `sleep_ms` param,
        else the node's `handler_ms`."""
        sleep_ms = _params(request).get("sleep_ms")
        if isinstance(sleep_ms, int | float):
            return sleep_ms / 1000.0
        return self.config.handler_ms / 1000.0

    def _record(self, event: str, request: Request, **extra: Any) -> None:
        self.ledger.write(stamp(event=event, id=request.id, node=self.config.name, **extra))

    def begin(self, request: Request) -> PendingRequest | None:
        pending = current_request()
        attempt = pending.delivery.attempt if pending is not None else None
        self._record("start", request, attempt=attempt, params=request.params)
        return pending

    def finish(self, request: Request, pending: PendingRequest | None) -> Any:
        if pending is not None and pending.cancelled:
            self._record("cancelled", request, reason=pending.cancel_reason)
        self._record("end", request)
        pad = _params(request).get("answer_pad")
        if isinstance(pad, int) and pad > 0:
            return {**_params(request), "pad": "x" * pad}
        return request.params

    def released(self, pending: PendingRequest | None) -> bool:
        """A barrier handler may return: barrier file present, node stopping, or cancelled."""
        if self.stopping.is_set() or Path(self.config.barrier_path).exists():
            return True
        return self.config.honour_cancel and pending is not None and pending.cancelled

    def run_in_thread(self, request: Request) -> Any:
        pending = self.begin(request)
        kind = self.config.handler
        if kind == "sleep" and self.config.honour_cancel and pending is not None:
            pending.wait_cancelled(self.seconds(request))
        elif kind in ("sleep", "block"):
            time.sleep(self.seconds(request))  # the handler's work: it holds its thread
        elif kind == "barrier":
            while not self.released(pending):
                time.sleep(WATCH_INTERVAL_S)  # polls the barrier file
        return self.finish(request, pending)

    async def run_on_loop(self, request: Request) -> Any:
        pending = self.begin(request)
        kind = self.config.handler
        if kind == "sleep":
            deadline = time.monotonic() + self.seconds(request)
            while time.monotonic() < deadline:
                if self.config.honour_cancel and pending is not None and pending.cancelled:
                    break
                await asyncio.sleep(min(WATCH_INTERVAL_S, max(0.0, deadline - time.monotonic())))
        elif kind == "block":
            time.sleep(self.seconds(request))  # blocks the event loop on purpose
        elif kind == "barrier":
            while not self.released(pending):
                await asyncio.sleep(WATCH_INTERVAL_S)
        return self.finish(request, pending)


async def _serve_async(
    queue: AsyncQueue, config: NodeConfig, endpoint: str, handler: Any, stop: asyncio.Event
) -> None:
    """Serve `endpoint` until `stop`; not while its serve-off switch is on."""
    off = config.switch("serve-off", endpoint)
    if off is None:
        await queue.serve(endpoint, handler, concurrency=config.concurrency, stop=stop)
        return
    while not stop.is_set():
        if off.exists():
            await asyncio.sleep(SWITCH_POLL_S)  # polls the switch file
            continue
        serving_stop = asyncio.Event()
        serving = asyncio.create_task(
            queue.serve(endpoint, handler, concurrency=config.concurrency, stop=serving_stop)
        )
        while not (stop.is_set() or off.exists() or serving.done()):
            await asyncio.sleep(SWITCH_POLL_S)  # polls the switch file
        serving_stop.set()
        await serving


async def _receiver_async(config: NodeConfig, service: Service) -> None:
    redis_settings, kwargs = _queue_args(config)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    queue = AsyncQueue(redis_settings, **kwargs)
    await queue.start()
    handler = service.run_in_thread if config.handler_in_thread else service.run_on_loop
    serving = asyncio.gather(
        *(_serve_async(queue, config, endpoint, handler, stop) for endpoint in config.endpoints)
    )
    write_ready(config)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), config.duration_s)
    stop.set()
    service.stopping.set()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(serving, RECEIVER_DRAIN_S)
    await asyncio.wait_for(queue.aclose(), CLOSE_TIMEOUT_S)


def _serve_sync(
    queue: Queue, config: NodeConfig, endpoint: str, handler: Any, stop: threading.Event
) -> None:
    """Serve `endpoint` until `stop` (in a thread); not while its serve-off switch is on."""
    off = config.switch("serve-off", endpoint)
    if off is None:
        queue.serve(endpoint, handler, concurrency=config.concurrency, stop=stop)
        return
    while not stop.is_set():
        if off.exists():
            stop.wait(SWITCH_POLL_S)  # polls the switch file
            continue
        serving_stop = threading.Event()
        serving = threading.Thread(
            target=queue.serve,
            args=(endpoint, handler),
            kwargs={"concurrency": config.concurrency, "stop": serving_stop},
            name=f"serve-{endpoint}",
            daemon=True,
        )
        serving.start()
        while not (stop.is_set() or off.exists() or not serving.is_alive()):
            stop.wait(SWITCH_POLL_S)  # polls the switch file
        serving_stop.set()
        serving.join(RECEIVER_DRAIN_S)


def _receiver_sync(config: NodeConfig, service: Service) -> None:
    redis_settings, kwargs = _queue_args(config)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    queue = Queue(redis_settings, **kwargs)
    queue.start()
    serving = [
        threading.Thread(
            target=_serve_sync,
            args=(queue, config, endpoint, service.run_in_thread, stop),
            name="serve",
            daemon=True,
        )
        for endpoint in config.endpoints
    ]
    for thread in serving:
        thread.start()
    write_ready(config)
    stop.wait(config.duration_s)
    stop.set()
    service.stopping.set()
    drain_end = time.monotonic() + RECEIVER_DRAIN_S
    for thread in serving:
        thread.join(max(0.0, drain_end - time.monotonic()))
    queue.close()


def _receiver_plain(config: NodeConfig, service: Service) -> None:
    """`serve` in the main thread, with no stop of ours: SIGTERM is prq's (prq.serve.sigterm)."""
    if config.duration_s is not None or config.extra_endpoints or config.switch_dir:
        raise ValueError("plain_serve serves one endpoint until it is stopped")
    redis_settings, kwargs = _queue_args(config)
    if config.facade == "sync":
        with Queue(redis_settings, **kwargs) as queue:
            write_ready(config)
            queue.serve(config.endpoint, service.run_in_thread, concurrency=config.concurrency)
        return

    async def serve() -> None:
        async with AsyncQueue(redis_settings, **kwargs) as queue:
            write_ready(config)
            handler = service.run_in_thread if config.handler_in_thread else service.run_on_loop
            await queue.serve(config.endpoint, handler, concurrency=config.concurrency)

    asyncio.run(serve())


def run_receiver(config: NodeConfig) -> int:
    service = Service(config, threading.Event())
    if config.plain_serve:
        _receiver_plain(config, service)
    elif config.facade == "sync":
        _receiver_sync(config, service)
    else:
        asyncio.run(_receiver_async(config, service))
    service.ledger.close()
    return 0


# -- sender -------------------------------------------------------------------------------------


class NextCall(NamedTuple):
    request_id: str
    tag: str
    endpoint: str
    params: dict[str, Any]


class Calls:
    """Hands out call numbers up to `count` and records each call's start and end."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.history = JsonlWriter(config.history_path, fsync=False)
        self._numbers: Iterator[int] = itertools.count()
        self._lock = threading.Lock()

    def open_endpoints(self) -> list[str]:
        """The node's endpoints whose calls-off switch is not on."""
        return [
            endpoint
            for endpoint in self.config.endpoints
            if not ((off := self.config.switch("calls-off", endpoint)) and off.exists())
        ]

    def next_call(self, caller: int, endpoints: list[str]) -> NextCall | None:
        """The next call (to `endpoints` in turn), or None when `count` calls were made."""
        with self._lock:
            number = next(self._numbers)
            if self.config.count is not None and number >= self.config.count:
                return None
        tag = f"{self.config.name}/{caller}/{number}"
        ids = self.config.request_ids
        request_id = ids[number] if number < len(ids) else uuid.uuid4().hex
        endpoint = endpoints[number % len(endpoints)]
        self.history.write(
            stamp(
                event="start",
                id=request_id,
                tag=tag,
                node=self.config.name,
                caller=caller,
                endpoint=endpoint,
                delivery=self.config.delivery,
                deadline_s=self.config.call_deadline_s,
            )
        )
        return NextCall(request_id, tag, endpoint, {**self.config.params, "tag": tag})

    def record_end(
        self,
        request_id: str,
        tag: str,
        result: Any,
        exc: BaseException | None,
        via: str = "call",
    ) -> None:
        """An `end` line; `via` says what delivered the outcome: call, send (raised),
        on_response or on_failure."""
        fields: dict[str, Any] = {"event": "end", "id": request_id, "tag": tag, "via": via}
        if exc is None:
            result_tag = result.get("tag") if isinstance(result, dict) else None
            fields.update(outcome="ok", tag_ok=result_tag == tag, result_tag=result_tag)
        else:
            fields.update(
                outcome=type(exc).__name__,
                message=str(exc)[:300],
                prq_error=isinstance(exc, PrqError),
                maybe_executed=getattr(exc, "maybe_executed", None),
                retryable=getattr(exc, "retryable", None),
            )
        self.history.write(stamp(node=self.config.name, **fields))

    def record_response(self, call: NextCall, response: Response) -> None:
        """What `send`'s on_response got: the echo, or the error the service raised (which
        `call` would raise as RemoteError)."""
        try:
            result = _result(call, response)
        except RemoteError as remote:
            self.record_end(call.request_id, call.tag, None, remote, via="on_response")
            return
        self.record_end(call.request_id, call.tag, result, None, via="on_response")

    def record_stopped(self, unfinished: int, unfinished_handles: int = 0) -> None:
        self.history.write(
            stamp(
                event="stopped",
                node=self.config.name,
                unfinished=unfinished,
                unfinished_handles=unfinished_handles,
            )
        )


def _result(call: NextCall, response: Response) -> Any:
    """The response's result, or the RemoteError `call` would raise for it."""
    if response.error is not None:
        raise RemoteError(response.error, request_id=call.request_id, endpoint=call.endpoint)
    return response.result


def _wait_for_go(config: NodeConfig) -> None:
    while config.go_path and not Path(config.go_path).exists():
        time.sleep(WATCH_INTERVAL_S)  # polls the go file; the watchdog bounds the wait


def _outcome_wait_s(config: NodeConfig) -> float:
    """How long a send-style caller waits for its callback before it moves on (the call then
    stays unfinished, and the checker judges it hung)."""
    return config.call_deadline_s + config.drain_timeout_s


class _Outcome:
    """The two callbacks of one `send`: each run writes an `end` line, then sets `fired`."""

    def __init__(self, calls: Calls, call: NextCall, fired: Any) -> None:
        self.calls, self.call, self.fired = calls, call, fired

    def on_response(self, response: Response) -> None:
        self.calls.record_response(self.call, response)
        self.fired.set()

    def on_failure(self, error: PrqError) -> None:
        self.calls.record_end(self.call.request_id, self.call.tag, None, error, via="on_failure")
        self.fired.set()


class _AsyncCaller:
    """One call on the asyncio queue, by `call` or by `send` (config.call_style)."""

    def __init__(self, queue: AsyncQueue, config: NodeConfig, calls: Calls) -> None:
        self.queue, self.config, self.calls = queue, config, calls
        self.handles: list[SendHandle] = []

    async def one(self, call: NextCall) -> None:
        if self.config.call_style == "send":
            await self._send(call)
            return
        result: Any = None
        error: BaseException | None = None
        try:
            result = await self._call(call)
        except Exception as exc:
            error = exc
        self.calls.record_end(call.request_id, call.tag, result, error)

    async def _call(self, call: NextCall) -> Any:
        timeout_s = self.config.call_timeout_s
        if self.config.delivery == "at_most_once":
            return await self.queue.call(
                call.endpoint, "echo", call.params, request_id=call.request_id, timeout_s=timeout_s
            )
        request = self.queue.build_request(
            call.endpoint,
            "echo",
            call.params,
            request_id=call.request_id,
            delivery=self.config.delivery,
        )
        return _result(call, await self.queue.queue_and_wait(request, timeout_s=timeout_s))

    async def _send(self, call: NextCall) -> None:
        outcome = _Outcome(self.calls, call, asyncio.Event())
        request = self.queue.build_request(
            call.endpoint,
            "echo",
            call.params,
            request_id=call.request_id,
            delivery=self.config.delivery,
        )
        try:
            handle = await self.queue.send(
                request,
                on_response=outcome.on_response,
                on_failure=outcome.on_failure,
                timeout_s=self.config.call_timeout_s,
            )
        except Exception as exc:  # send itself failed: no callback is due
            self.calls.record_end(call.request_id, call.tag, None, exc, via="send")
            return
        self.handles.append(handle)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(outcome.fired.wait(), _outcome_wait_s(self.config))

    async def unfinished_handles(self, until: float) -> int:
        """Wait (until `until`, monotonic) for every send's outcome to be delivered."""
        while any(not h.finished for h in self.handles) and time.monotonic() < until:
            await asyncio.sleep(WATCH_INTERVAL_S)
        return sum(not h.finished for h in self.handles)


class _SyncCaller:
    """One call on the blocking queue, by `call` or by `send` (config.call_style)."""

    def __init__(self, queue: Queue, config: NodeConfig, calls: Calls) -> None:
        self.queue, self.config, self.calls = queue, config, calls
        self.handles: list[BlockingSendHandle] = []

    def one(self, call: NextCall) -> None:
        if self.config.call_style == "send":
            self._send(call)
            return
        result: Any = None
        error: BaseException | None = None
        try:
            result = self._call(call)
        except Exception as exc:
            error = exc
        self.calls.record_end(call.request_id, call.tag, result, error)

    def _call(self, call: NextCall) -> Any:
        timeout_s = self.config.call_timeout_s
        if self.config.delivery == "at_most_once":
            return self.queue.call(
                call.endpoint, "echo", call.params, request_id=call.request_id, timeout_s=timeout_s
            )
        request = self.queue.build_request(
            call.endpoint,
            "echo",
            call.params,
            request_id=call.request_id,
            delivery=self.config.delivery,
        )
        return _result(call, self.queue.queue_and_wait(request, timeout_s=timeout_s))

    def _send(self, call: NextCall) -> None:
        outcome = _Outcome(self.calls, call, threading.Event())
        request = self.queue.build_request(
            call.endpoint,
            "echo",
            call.params,
            request_id=call.request_id,
            delivery=self.config.delivery,
        )
        try:
            handle = self.queue.send(
                request,
                on_response=outcome.on_response,
                on_failure=outcome.on_failure,
                timeout_s=self.config.call_timeout_s,
            )
        except Exception as exc:  # send itself failed: no callback is due
            self.calls.record_end(call.request_id, call.tag, None, exc, via="send")
            return
        self.handles.append(handle)
        outcome.fired.wait(_outcome_wait_s(self.config))

    def unfinished_handles(self, until: float) -> int:
        """Wait (until `until`, monotonic) for every send's outcome to be delivered."""
        while any(not h.finished for h in self.handles) and time.monotonic() < until:
            time.sleep(WATCH_INTERVAL_S)  # polls the handles; bounded by `until`
        return sum(not h.finished for h in self.handles)


async def _sender_async(config: NodeConfig, calls: Calls) -> int:
    redis_settings, kwargs = _queue_args(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    queue = AsyncQueue(redis_settings, **kwargs)
    await queue.start()
    write_ready(config)
    await loop.run_in_executor(None, _wait_for_go, config)
    one = _AsyncCaller(queue, config, calls)

    async def caller(number: int) -> None:
        while not stop.is_set():
            endpoints = calls.open_endpoints()
            if not endpoints:
                await asyncio.sleep(SWITCH_POLL_S)  # polls the switch files
                continue
            call = calls.next_call(number, endpoints)
            if call is None:
                return
            await one.one(call)
            if config.think_ms:
                await asyncio.sleep(config.think_ms / 1000.0)

    callers = [asyncio.create_task(caller(n)) for n in range(config.concurrency)]
    all_done = asyncio.ensure_future(asyncio.wait(callers))
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait(
        {all_done, stopped}, timeout=config.duration_s, return_when="FIRST_COMPLETED"
    )
    stop.set()
    stopped.cancel()
    drain_end = time.monotonic() + config.drain_timeout_s
    _, pending = await asyncio.wait(callers, timeout=config.drain_timeout_s)
    calls.record_stopped(len(pending), await one.unfinished_handles(drain_end))
    if pending:
        os._exit(EXIT_UNFINISHED)  # calls still hang: leave without waiting for them
    await asyncio.wait_for(queue.aclose(), CLOSE_TIMEOUT_S)
    return 0


def _sender_sync(config: NodeConfig, calls: Calls) -> int:
    redis_settings, kwargs = _queue_args(config)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    queue = Queue(redis_settings, **kwargs)
    queue.start()
    write_ready(config)
    _wait_for_go(config)
    one = _SyncCaller(queue, config, calls)

    def caller(number: int) -> None:
        while not stop.is_set():
            endpoints = calls.open_endpoints()
            if not endpoints:
                stop.wait(SWITCH_POLL_S)  # polls the switch files
                continue
            call = calls.next_call(number, endpoints)
            if call is None:
                return
            one.one(call)
            if config.think_ms:
                stop.wait(config.think_ms / 1000.0)

    threads = [
        threading.Thread(target=caller, args=(n,), name=f"caller-{n}", daemon=True)
        for n in range(config.concurrency)
    ]
    for thread in threads:
        thread.start()
    end = None if config.duration_s is None else time.monotonic() + config.duration_s
    while not stop.is_set() and any(t.is_alive() for t in threads):
        if end is not None and time.monotonic() >= end:
            break
        stop.wait(0.05)  # the main thread's poll of its callers
    stop.set()
    drain_end = time.monotonic() + config.drain_timeout_s
    for thread in threads:
        thread.join(max(0.0, drain_end - time.monotonic()))
    unfinished = sum(1 for t in threads if t.is_alive())
    calls.record_stopped(unfinished, one.unfinished_handles(drain_end))
    if unfinished:
        os._exit(EXIT_UNFINISHED)
    queue.close()
    return 0


def run_sender(config: NodeConfig) -> int:
    calls = Calls(config)
    if config.facade == "sync":
        return _sender_sync(config, calls)
    return asyncio.run(_sender_async(config, calls))
