"""serve(): the server loop around dequeue, the handler, and apply_response.

The loop takes as many requests as it has free slots (one take for several), runs each in the
handler (a coroutine function on the loop, a plain function in a worker thread, so the loop and
its heartbeats never wait on the handler's CPU), and answers. A handler exception becomes
`Response.error`; an answer that cannot be sent (too large, not JSON) ends the call with an
error saying why (see `apply_response`). A failing Redis never kills the loop: it backs off
with jitter and goes on. On stop it takes nothing new and finishes what it holds; when the
queue closes, the handlers still running get the queue's shutdown timeout to answer (see
`AsyncQueue.aclose`).

This module holds the two loops' control flow: `serve_async` (asyncio) and `serve_sync`
(threads). What they hold and how they answer lives beside it: async_held and async_answers
(asyncio), take_turns and answer_turns (threads), pace (take-ahead and back-off), current
(current_request and the handler calls), served (what the loops need of a queue: the facades
above satisfy it, and are not imported here).
"""

from __future__ import annotations

import asyncio
import logging
import threading

from prq.core.errors import PrqError, QueueShutdown
from prq.core.lifecycle import PendingRequest
from prq.core.names import validate_endpoint
from prq.protocol.effects import Handler
from prq.serve.answer_turns import _answer, _AnswerTurns
from prq.serve.async_held import _AsyncHeld
from prq.serve.current import _async_runner
from prq.serve.pace import _backoff_s, _log_failure
from prq.serve.served import AsyncServedQueue, BlockingServedQueue
from prq.serve.take_turns import JOIN_WAKE_S, _TakeTurns

logger = logging.getLogger(__name__)

__all__ = ["serve_async", "serve_sync"]


# -- asyncio ------------------------------------------------------------------------------------


async def serve_async(
    queue: AsyncServedQueue,
    endpoint: str,
    handler: Handler,
    *,
    concurrency: int = 1,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve `endpoint` with `handler` until `stop` is set or the queue closes.

    At most `concurrency` handlers run at once. A handler's slot is free as soon as it returns:
    its answer is written apart (batched with the others' by the node's link), the request
    held (beaten for, counted as serving) until it is. While the handlers are quick (_Pace)
    and work is waiting, the loop takes ahead: the next take goes out before the requests just
    taken are run, so Redis hands out the next batch while this process runs the last one
    (up to `concurrency` requests more are held, waiting for a slot)."""
    validate_endpoint(endpoint)
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    held = _AsyncHeld(queue, _async_runner(handler, concurrency), concurrency)

    def stopped() -> bool:
        return (stop is not None and stop.is_set()) or queue.closed

    failures = 0
    logger.info("serving endpoint=%r concurrency=%d", endpoint, concurrency)
    try:
        while not stopped():
            free = held.room()
            if free <= 0:
                await held.wait_for_room()
                continue
            try:
                taken = await queue._take(endpoint, free, queue.settings.dequeue_timeout_s, stopped)
                failures = 0
            except QueueShutdown:
                break
            except PrqError as exc:
                failures = _log_failure(endpoint, exc, failures)
                await asyncio.sleep(_backoff_s(failures))
                continue
            for pending in taken:
                held.start(pending)
            if not held.taking_ahead or len(taken) < free:
                # Let the new handlers start before the next take: a quick handler's response
                # then goes out first, instead of queueing behind the take that parks this
                # loop. (A full batch of quick ones: the next take goes first, see above.)
                await asyncio.sleep(0)
    finally:
        await held.finish()
        logger.info("stopped serving endpoint=%r", endpoint)


# -- threads ------------------------------------------------------------------------------------


def serve_sync(
    queue: BlockingServedQueue,
    endpoint: str,
    handler: Handler,
    *,
    concurrency: int = 1,
    stop: threading.Event | None = None,
) -> None:
    """Serve `endpoint` with `handler` until `stop` is set or the queue closes.

    Each of the `concurrency` workers runs requests in its own thread (the calling thread when
    `concurrency` is 1). One of the idle workers at a time takes from Redis, for itself and for
    every other idle worker: it runs the first request it gets itself (a request passes no
    thread hand-off between its pulse and its handler) and leaves the rest to the others, so
    one take serves many workers when work is waiting. Answers go the same way (_AnswerTurns):
    the worker that finds no answer being written writes its own at once, with those the
    others leave meanwhile, while they go on to their next request. On stop no worker takes
    again, and what was taken is run and answered before this returns.
    """
    validate_endpoint(endpoint)
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    pause = stop or threading.Event()

    def stopped() -> bool:
        return pause.is_set() or queue.closed

    turns = _TakeTurns(queue, endpoint, stopped, pause, concurrency)
    answers = _AnswerTurns(queue)

    def work() -> None:
        pending: PendingRequest | None = None
        while True:
            pending, going = turns.next_request(ran=pending is not None)
            if pending is not None:
                _answer(queue, handler, pending, answers, turns.pace)
            elif not going:
                return

    logger.info("serving endpoint=%r concurrency=%d", endpoint, concurrency)
    if concurrency == 1:
        work()
    else:
        workers = [
            threading.Thread(target=work, name=f"prq-serve-{n}", daemon=True)
            for n in range(concurrency)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            # In short joins: a signal the kernel delivers to another thread only reaches its
            # Python handler (SIGTERM's stop, prq.serve.sigterm) when the main thread next wakes.
            while worker.is_alive():
                worker.join(JOIN_WAKE_S)
    logger.info("stopped serving endpoint=%r", endpoint)
