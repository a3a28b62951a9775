"""The turns of one blocking serve loop's worker threads at taking from Redis (_TakeTurns): one
idle worker at a time takes for itself and the others, and wakes as many of them as the
requests it brought need.
"""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Callable

from prq.core.errors import PrqError, QueueShutdown
from prq.core.lifecycle import PendingRequest
from prq.serve.pace import _backoff_s, _log_failure, _Pace
from prq.serve.served import BlockingServedQueue

#: How often a main thread waiting for its serve threads wakes (so that signals are handled),
#: and a serve thread waiting for a request looks whether one waits for it unannounced.
JOIN_WAKE_S = 0.2
#: A blocking serve loop wakes one worker thread per this much expected handler time of the
#: requests a take brought beyond the taker's own (see _TakeTurns): a thread hand-off costs
#: more CPU than a quick handler's whole run.
SHARE_S = 0.002
#: A blocking serve loop whose handlers are quick (TAKE_AHEAD_BELOW_S) takes ahead once the
#: requests left in its backlog hold no more than this much expected handler time (about a
#: take's round trip): the next take is on its way while the workers run what is left.
TAKE_AHEAD_LEFT_S = 0.002


class _TakeTurns:
    """The workers of one `serve_sync`: one idle worker at a time takes from Redis, for itself
    and for every worker waiting meanwhile; what it takes beyond its own first request waits
    in a backlog for the others (held, so beaten for, and counted as serving at once).

    Only as many workers are woken for the backlog as the handlers' pace asks for (`helpers`):
    one per SHARE_S of expected handler time, and one to take next. Quick handlers run one
    after another on a few threads (a wake-up costs a thread more CPU than an echo handler's
    whole run: waking one per request halved a drain's rate); slow ones get a thread each, as
    before the pace is known. A worker that takes a request from the backlog wakes one more
    while what is left is more than SHARE_S of work. A run far slower than the average holds
    the requests behind it until a sleeping worker's timed wait (JOIN_WAKE_S) finds them.

    While the handlers are quick (_Pace.quick) the workers take ahead, as the asyncio loop
    does: a worker that finds little left in the backlog (TAKE_AHEAD_LEFT_S) takes the next
    batch while the others run what is left, so Redis hands it out meanwhile; up to twice
    `concurrency` requests are then held (run, or waiting in the backlog). Such a take does not
    park when nothing waits in Redis: the worker is one of the handlers' threads, and goes on
    to run what is left."""

    def __init__(
        self,
        queue: BlockingServedQueue,
        endpoint: str,
        stopped: Callable[[], bool],
        pause: threading.Event,
        concurrency: int = 1,
    ) -> None:
        self.queue = queue
        self.endpoint = endpoint
        self.stopped = stopped
        self.pause = pause
        self.concurrency = concurrency
        self.turns = threading.Condition()
        self.backlog: collections.deque[PendingRequest] = collections.deque()
        self.taking = False  # a worker is taking from Redis
        self.waiting = 0  # workers waiting for a request while another one takes
        self.running = 0  # requests a worker got and has not come back from
        self.failures = 0
        #: How long the handlers run (each worker adds its runs; a lost update is harmless).
        self.pace = _Pace()

    def helpers(self, left: int) -> int:
        """How many more workers `left` requests waiting in the backlog need (call with the
        turns held)."""
        mean_s = self.pace.mean_s
        if left <= 0 or mean_s is None:
            return max(0, left)
        return max(1, min(left, math.ceil(left * mean_s / SHARE_S)))

    def room(self) -> int:
        """How many requests a take may bring now: up to `concurrency` held (twice that while
        the handlers are quick), counting those running and those in the backlog (call with
        the turns held)."""
        held = self.concurrency * (2 if self.pace.quick else 1)
        return held - self.running - len(self.backlog)

    def _takes_ahead(self) -> bool:
        """Whether the calling worker, which finds requests in the backlog, should take the
        next batch first: the handlers are quick, other workers can run what is left, and
        that is little (call with the turns held)."""
        mean_s = self.pace.mean_s
        return (
            self.concurrency > 1
            and not self.taking
            and mean_s is not None
            and self.pace.quick
            and len(self.backlog) * mean_s <= TAKE_AHEAD_LEFT_S
            and self.room() > 0
            and not self.stopped()
        )

    def next_request(self, ran: bool = False) -> tuple[PendingRequest | None, bool]:
        """The next request for the calling worker (None: none this turn), taken for it and
        the waiting others if none waits (or taken ahead, see the class); and whether the
        worker should go on. `ran`: the worker comes back from running a request."""
        with self.turns:
            if ran:
                self.running -= 1
            while not self.backlog and self.taking and not self.stopped():
                self.waiting += 1
                self.turns.wait(JOIN_WAKE_S)
                self.waiting -= 1
            ahead = bool(self.backlog) and self._takes_ahead()
            if self.backlog and not ahead:
                pending = self.backlog.popleft()
                self.running += 1
                if self.backlog and self.waiting and self.helpers(len(self.backlog)) > 1:
                    self.turns.notify(1)  # (more work left than this worker does soon)
                return pending, True
            if self.stopped():
                return None, False
            self.taking = True
            want = max(1, self.room())
            if self.backlog and self.waiting:
                self.turns.notify(1)  # (to run what is left while this worker takes)
        taken: list[PendingRequest] = []
        try:
            # (a take ahead does not park: the worker runs what is left if nothing waits)
            timeout_s = 0.0 if ahead else self.queue.settings.dequeue_timeout_s
            taken = self.queue._take(self.endpoint, want, timeout_s, self.stopped)
            self.failures = 0
        except QueueShutdown:
            return None, False
        except PrqError as exc:
            self.failures = _log_failure(self.endpoint, exc, self.failures)
            self.pause.wait(_backoff_s(self.failures))
        finally:
            with self.turns:
                self.taking = False
                for pending in taken:  # running from now on, for the queue's closing
                    self.queue._serving.add(pending.id)
                self.backlog.extend(taken)  # (behind what was left: taken ahead)
                # the workers the requests left over need (one each until the handlers' pace
                # is known), and one to take next; this one runs the first
                self.turns.notify(self.helpers(len(self.backlog) - 1) + 1)
        with self.turns:
            mine = self.backlog.popleft() if self.backlog else None
            if mine is not None:
                self.running += 1
        return mine, True
