"""send(): a call whose outcome arrives through callbacks, and its handle.

Exactly one of `on_response(response)` and `on_failure(error)` runs, exactly once, unless the
handle is withdrawn before pickup (then neither runs):

- `on_response` gets the service's answer, a `Response` (its `.error` is set when the handler
  raised);
- `on_failure` gets the `PrqError` that says why no answer came (PickupTimeout, ReceiverLost,
  DataLoss, QueueUnavailable, QueueShutdown when the queue closes, ...).

A callback that raises is logged, never followed by the other callback. On the asyncio queue a
callback may be a coroutine function (awaited on the loop) or a plain function (called on the
loop: keep it short); on the blocking queue callbacks run in the thread that waits for the
outcome, one per send.

`withdraw()` first waits for the enqueue step to answer, then withdraws the request if no
receiver has taken it yet: True, and neither callback runs. False when it is too late (taken,
answered, or ended): the callbacks run as they would have.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from prq.core.errors import PrqError
from prq.core.models import Request, Response
from prq.node.data_loss.counters import CallMark
from prq.protocol.effects import Flow
from prq.protocol.flows.cancel import withdraw_own_flow
from prq.protocol.flows.context import Context

logger = logging.getLogger(__name__)

__all__ = ["BlockingSendHandle", "OnFailure", "OnResponse", "SendHandle"]

#: The callbacks of `send` (on the asyncio queue they may also be coroutine functions).
OnResponse = Callable[[Response], Any]
OnFailure = Callable[[PrqError], Any]

T = TypeVar("T")


class AsyncSendingQueue(Protocol):
    """What a `SendHandle` needs of its queue (AsyncQueue is one): the node's context, the
    flow driver, and the call it waits on. Typed here so that this module imports no facade."""

    ctx: Context

    async def _run(
        self, flow: Flow[T], mark: CallMark | None = None, *, closing_ok: bool = False
    ) -> T: ...

    async def _queue_and_wait(
        self,
        request: Request,
        pickup_timeout_s: float | None,
        timeout_s: float | None,
        on_enqueued: Callable[[], None] | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> Response: ...


class BlockingSendingQueue(Protocol):
    """What a `BlockingSendHandle` needs of its queue (Queue is one): as AsyncSendingQueue,
    with blocking calls."""

    ctx: Context

    def _run(
        self, flow: Flow[T], mark: CallMark | None = None, *, closing_ok: bool = False
    ) -> T: ...

    def _queue_and_wait(
        self,
        request: Request,
        pickup_timeout_s: float | None,
        timeout_s: float | None,
        on_enqueued: Callable[[], None] | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> Response: ...


class SendState:
    """The state both handles share: enqueued yet, withdrawn, and the callback fired once."""

    def __init__(self, request: Request, on_response: OnResponse, on_failure: OnFailure) -> None:
        self.request = request
        self.on_response = on_response
        self.on_failure = on_failure
        self.lock = threading.Lock()
        self.fired = False
        #: withdraw() is deciding: an outcome "cancelled before pickup" waits for its verdict
        self.withdrawing = False
        self.withdrawn = False

    def claim(self) -> bool:
        """Whether the outcome may fire a callback: once, and never once withdrawn (whatever
        the call then comes to: its cancellation, or a close, an expiry or a loss before it
        saw that)."""
        with self.lock:
            if self.fired or self.withdrawn:
                return False
            self.fired = True
            return True

    def callback(self, response: Response | None, error: PrqError | None) -> tuple[Any, Any]:
        if error is not None:
            return self.on_failure, error
        return self.on_response, response


class SendHandle:
    """What `AsyncQueue.send` returns: the request id, whether the outcome was delivered, and
    `withdraw()`."""

    def __init__(self, queue: AsyncSendingQueue, state: SendState) -> None:
        self._queue = queue
        self._state = state
        self._enqueued = asyncio.Event()
        self._decided = asyncio.Event()
        self._decided.set()
        self._task: asyncio.Task[None] | None = None

    @property
    def request_id(self) -> str:
        return self._state.request.id

    @property
    def done(self) -> bool:
        """True once a callback ran (or the request was withdrawn)."""
        return self._state.fired or self._state.withdrawn

    @property
    def finished(self) -> bool:
        """True once the outcome was delivered (or dropped, withdrawn): nothing more runs."""
        return self._task is not None and self._task.done()

    async def withdraw(self) -> bool:
        """Withdraw the request if no receiver took it yet: True, and neither callback runs."""
        state = self._state
        assert self._task is not None
        if state.fired or state.withdrawn:
            return state.withdrawn
        enqueued = asyncio.ensure_future(self._enqueued.wait())
        await asyncio.wait([self._task, enqueued], return_when=asyncio.FIRST_COMPLETED)
        enqueued.cancel()
        if self._task.done():
            return state.withdrawn
        state.withdrawing = True
        self._decided.clear()
        try:
            request = state.request
            mine = await self._queue._run(
                withdraw_own_flow(self._queue.ctx, request.endpoint, request.id)
            )
            state.withdrawn = mine and not state.fired
        finally:
            state.withdrawing = False
            self._decided.set()
        return state.withdrawn

    async def _run(self, pickup_timeout_s: float | None, timeout_s: float | None) -> None:
        state = self._state
        response: Response | None = None
        error: PrqError | None = None
        try:
            response = await self._queue._queue_and_wait(
                state.request, pickup_timeout_s, timeout_s, self._enqueued.set
            )
        except PrqError as exc:
            error = exc
        finally:
            self._enqueued.set()
        if error is not None:
            # (a withdraw() in progress says whether the request is withdrawn: then no
            # callback runs, be it its cancellation or a close or a loss seen before that)
            await self._decided.wait()
        if not state.claim():
            return
        callback, value = state.callback(response, error)
        try:
            result = callback(value)
            if inspect.isawaitable(result):
                await result
        except Exception:
            logger.exception("send callback raised request_id=%s", state.request.id)


class BlockingSendHandle:
    """What `Queue.send` returns: as `SendHandle`, with a blocking `withdraw()`."""

    def __init__(self, queue: BlockingSendingQueue, state: SendState) -> None:
        self._queue = queue
        self._state = state
        self._enqueued = threading.Event()
        self._decided = threading.Event()
        self._decided.set()
        self._thread: threading.Thread | None = None

    @property
    def request_id(self) -> str:
        return self._state.request.id

    @property
    def done(self) -> bool:
        """True once a callback ran (or the request was withdrawn)."""
        return self._state.fired or self._state.withdrawn

    @property
    def finished(self) -> bool:
        """True once the outcome was delivered (or dropped, withdrawn): nothing more runs."""
        return self._thread is not None and not self._thread.is_alive()

    def withdraw(self) -> bool:
        """Withdraw the request if no receiver took it yet: True, and neither callback runs."""
        state = self._state
        assert self._thread is not None
        if state.fired or state.withdrawn:
            return state.withdrawn
        # the enqueue step answers within the retry budget (then the thread ends)
        while not self._enqueued.wait(0.05) and self._thread.is_alive():
            pass
        if not self._thread.is_alive():
            return state.withdrawn
        state.withdrawing = True
        self._decided.clear()
        try:
            request = state.request
            mine = self._queue._run(
                withdraw_own_flow(self._queue.ctx, request.endpoint, request.id)
            )
            state.withdrawn = mine and not state.fired
        finally:
            state.withdrawing = False
            self._decided.set()
        return state.withdrawn

    def _run(self, pickup_timeout_s: float | None, timeout_s: float | None) -> None:
        state = self._state
        response: Response | None = None
        error: PrqError | None = None
        try:
            response = self._queue._queue_and_wait(
                state.request, pickup_timeout_s, timeout_s, self._enqueued.set
            )
        except PrqError as exc:
            error = exc
        finally:
            self._enqueued.set()
        if error is not None:
            self._decided.wait()  # (as SendHandle._run)
        if not state.claim():
            return
        callback, value = state.callback(response, error)
        try:
            callback(value)
        except Exception:
            logger.exception("send callback raised request_id=%s", state.request.id)
