"""SyncRedisIO: the blocking twin of AsyncRedisIO (async_io.py), batching by group commit.

Error translation (translate.py), the retry policy (budgets.py) and the reply splitting
(batches.py) are the same for both; only the way steps wait for their round trip differs: the
thread that finds no round trip in flight leads and sends every waiting step, the others wait
on their call's event (an express step may go beside the batch in flight: see SyncRedisIO).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from tenacity import Retrying

from prq.core.config import QueueSettings, RedisSettings
from prq.core.errors import PrqError, QueueShutdown, QueueUnavailable
from prq.observe import metrics
from prq.protocol.effects import Call, Reply
from prq.protocol.scripts.loading import script_load_calls
from prq.protocol.scripts.merging import merge_calls
from prq.transport.batches import (
    DEFAULT_MAX_BATCH_STEPS,
    MAX_ROUND_TRIPS_IN_FLIGHT,
    IOCounters,
    _needs_scripts,
    _split,
)
from prq.transport.budgets import STEP_GRACE_S, StepBudgets
from prq.transport.client_options import client_kwargs
from prq.transport.links import SyncLink, sync_link
from prq.transport.reachability import Reachability
from prq.transport.sync_cluster_links import SyncClusterLink
from prq.transport.tls import tls_configuration_error, tls_eof, tls_probe
from prq.transport.topology import close_client, sync_client
from prq.transport.translate import RedisUnavailable, _closed_error, _unavailable, translate_errors

logger = logging.getLogger(__name__)

__all__ = ["SyncRedisIO"]


class _Step:
    """One step waiting in the blocking batcher. `event` is its thread's, one for all the
    steps of one `execute_many` (an Event costs more than a quick handler's run): set when
    one of them is done, when its thread is to lead the next batch (`lead`), or (a cluster)
    when its thread is to retry it on its own (`alone`); the flag is always set first."""

    __slots__ = ("alone", "asked", "calls", "done", "event", "lead", "result")

    def __init__(self, calls: Sequence[Call], event: threading.Event, asked: float) -> None:
        self.calls = calls
        self.asked = asked
        self.event = event
        self.done = False
        self.alone = False
        self.lead = False
        self.result: list[Reply] | PrqError | None = None

    def finish(self, result: list[Reply] | PrqError) -> None:
        self.result = result
        self.done = True
        self.event.set()


def _client(redis_settings: RedisSettings) -> Any:
    """The blocking client. On a cluster redis-py reads the layout from the seed nodes as it is
    made, so what it raises here is prq's error: ConfigurationError for refused credentials,
    QueueUnavailable for seed nodes that do not answer."""
    try:
        with translate_errors():
            return sync_client(redis_settings.url, client_kwargs(redis_settings))
    except RedisUnavailable as exc:
        raise QueueUnavailable(f"Redis did not answer: {exc}") from exc


class SyncRedisIO(IOCounters):
    """Round trips to Redis for the blocking queue.

    Batches like AsyncRedisIO, by group commit: the thread that finds no batch in flight
    leads and sends every waiting step; the others wait. When the leader's batch is done, or
    its own steps are (the rest go back first in line; unsent, if its own were given up as
    late before the round trip), it passes the lead to the oldest waiting step's thread, so no
    thread serves others past its own bound.

    An express step (a receiver's take that does not park, while work waits) that finds a
    batch in flight on one server goes beside it, on a connection of its own, instead of
    waiting for it and the batch after it: a drain's takes would otherwise wait behind its
    answers. Its round trip and that batch's are unordered with each other (as round trips on
    a cluster are), and each attempt is bounded by its own socket timeout. One express step is
    in flight at a time; more wait in line. On a cluster the link's round trips overlap
    anyway (see _send_once).
    """

    def __init__(self, redis_settings: RedisSettings, settings: QueueSettings) -> None:
        super().__init__()
        self.settings = settings
        self.redis_settings = redis_settings
        self.client: Any = _client(redis_settings)
        self._lock = threading.Lock()
        self._pending: list[_Step] = []
        #: How many threads lead a batch now, and how many may at once: one on one server
        #: (its link carries one round trip at a time); on a cluster as many as the asyncio
        #: link has round trips in flight, so that a round trip held up on one shard (a node
        #: that accepts and never answers) keeps no later step waiting behind it
        self._leaders = 0
        #: An express step is in flight beside the batch (one server only: see `execute`).
        self._apart = False
        self._closed = False
        link = sync_link(self.client)
        #: Whether the link's round trips overlap (a cluster: each pipeline has connections of
        #: its own); one server's link carries one round trip at a time.
        self._overlapping = isinstance(link, SyncClusterLink)
        self._max_leaders = MAX_ROUND_TRIPS_IN_FLIGHT if self._overlapping else 1
        #: Every link made, and those no round trip uses now (one server: the leader's, and the
        #: express step's).
        self._links: list[SyncLink | SyncClusterLink] = [link]
        self._free: list[SyncLink | SyncClusterLink] = [link]
        self.reachability = Reachability(redis_settings.url, settings.retry_budget_s)
        self._step_deadline_s = (
            settings.retry_budget_s + redis_settings.socket_timeout_s + STEP_GRACE_S
        )

    def execute(self, calls: Sequence[Call], *, express: bool = False) -> list[Reply]:
        """Send one step's calls (in the next batch); retried within the budget. `express`:
        while a batch is in flight, send them beside it on a connection of their own (one such
        step at a time), not in the batch after it."""
        result = self.execute_many([calls], express=express)[0]
        if isinstance(result, PrqError):
            raise result
        return result

    def execute_many(
        self, steps: Sequence[Sequence[Call]], *, express: bool = False
    ) -> list[list[Reply] | PrqError]:
        """Send several independent steps in one batch; each gets its own replies or error
        (`express`: see `execute`)."""
        if self._closed:
            raise _closed_error()
        event, asked = threading.Event(), time.monotonic()
        mine = [_Step(calls, event, asked) for calls in steps]
        apart, lead = self._join(mine, express)
        if apart:
            try:
                self._send_batch(mine, mine)
            finally:
                with self._lock:
                    self._apart = False
            return [step.result for step in mine]  # type: ignore[misc]
        deadline = time.monotonic() + self._step_deadline_s
        while True:
            if lead:
                self._lead(mine)
            waiting = next((step for step in mine if not step.done), None)
            if waiting is None:
                break
            in_time = event.wait(max(0.0, deadline - time.monotonic()))
            if not in_time and self._abandon(mine):
                break
            event.clear()  # (the flags are read after: a signal set meanwhile is not lost)
            alone = next((step for step in mine if step.alone), None)
            if alone is not None:  # its round trip failed on a cluster node: retried apart
                alone.alone = False
                self._retry_alone(alone)
                event.set()  # (look again: another may be alone, or asked to lead)
                lead = False
                continue
            lead = False
            for step in mine:  # asked to lead the next batch
                if step.lead:
                    step.lead, lead = False, True
        results: list[list[Reply] | PrqError] = []
        for step in mine:
            assert step.result is not None
            results.append(step.result)
        return results

    def _join(self, mine: list[_Step], express: bool) -> tuple[bool, bool]:
        """Whether the steps go apart (express, beside the batch in flight), and if not,
        whether their thread leads a batch (else they wait in line for one)."""
        with self._lock:
            if express and self._leaders > 0 and not self._apart and not self._overlapping:
                self._apart = True
                return True, False
            self._pending.extend(mine)
            lead = self._leaders < self._max_leaders
            if lead:
                self._leaders += 1
            return False, lead

    def _abandon(self, mine: list[_Step]) -> bool:
        """The budget passed while waiting: give up the steps not yet done (True), unless this
        thread was just asked to lead (False: it goes on). Steps not yet sent never will be;
        steps in flight are indeterminate."""
        with self._lock:
            waiting = next((step for step in mine if not step.done), None)
            if waiting is None or waiting.event.is_set():  # (asked to lead, or alone)
                return waiting is None
            failure = _unavailable(
                RedisUnavailable("no round trip completed in time"), self.settings.retry_budget_s
            )
            for step in mine:
                if not step.done:
                    if step in self._pending:
                        self._pending.remove(step)
                    step.result = failure
                    step.done = True
            return True

    def _lead(self, mine: list[_Step]) -> None:
        try:
            with self._lock:
                batch = self._pending[:DEFAULT_MAX_BATCH_STEPS]
                del self._pending[: len(batch)]
            if batch:
                self._send_batch(batch, mine)
        finally:
            with self._lock:
                # (a step already asked to lead, whose thread has not taken its batch yet, is
                # not asked twice: the lead would be lost)
                first = next((step for step in self._pending if not step.lead), None)
                if first is not None:
                    first.lead = True  # its thread leads the next batch
                    first.event.set()
                else:
                    self._leaders -= 1

    def _send_batch(self, batch: list[_Step], mine: list[_Step]) -> None:
        # A step that waited past its budget (and a grace) behind earlier round trips is given
        # up unsent: the thread leading this batch may be its own, and one more attempt could
        # take it a socket timeout past the bound (budget + socket timeout + 1 s).
        budget_s = self.settings.retry_budget_s
        late = time.monotonic() - budget_s - STEP_GRACE_S
        for step in batch:
            if step.asked < late:
                step.finish(
                    _unavailable(RedisUnavailable("no round trip completed in time"), budget_s)
                )
        batch = [step for step in batch if not step.done]
        if not batch:
            return
        if all(step.done for step in mine):
            # This thread's own steps were just given up (or were never in the batch): it
            # sends nothing for the others, as one attempt could keep its caller a socket
            # timeout past its own bound. They go back first in line, and the lead passes to
            # the oldest one's thread (_lead), which sends them with its own.
            with self._lock:
                self._pending[:0] = batch
            return
        # The leading thread retries for the batch only while a step of its own is in it: once
        # its own are settled it hands the others back, first in line with their budgets still
        # counting, so its caller is not kept past its own bound serving later steps.
        budgets = StepBudgets(
            [step.calls for step in batch],
            [step.asked for step in batch],
            budget_s,
            lambda i, result: batch[i].finish(result),
            hand_over=lambda: all(step.done for step in mine),
        )
        if self._overlapping:
            self._send_once(budgets, batch)
            return
        try:
            self._send(budgets)
        except PrqError as exc:
            budgets.give_up(exc)
        except BaseException as exc:  # never leave a waiting thread behind
            budgets.give_up(PrqError(f"unexpected error while talking to Redis: {exc!r}"))
            raise
        if budgets.live:  # handed over: the lead passes to the oldest of them (_lead)
            with self._lock:
                self._pending[:0] = [batch[i] for i in budgets.live if not batch[i].done]

    def _send_once(self, budgets: StepBudgets, batch: list[_Step]) -> None:
        """On a cluster: one round trip for the batch; each step that failed on a node that
        could not be reached goes back to its own thread, which retries it apart (round trips
        may overlap there), so that the lead passes on and steps for the other shards go on."""
        try:
            budgets.answered(self._attempt(budgets.calls()))
        except RedisUnavailable as exc:
            logger.debug("redis attempt failed, retrying apart error=%s", exc)
            budgets.failed(exc)
        except PrqError as exc:
            budgets.give_up(exc)
        except BaseException as exc:  # never leave a waiting thread behind
            budgets.give_up(PrqError(f"unexpected error while talking to Redis: {exc!r}"))
            raise
        for i in budgets.live:
            batch[i].alone = True
            batch[i].event.set()

    def _retry_alone(self, step: _Step) -> None:
        budgets = StepBudgets(
            [step.calls], [step.asked], self.settings.retry_budget_s, lambda _, r: step.finish(r)
        )
        try:
            self._retry(budgets)
        except PrqError as exc:
            budgets.give_up(exc)
        except BaseException as exc:
            budgets.give_up(PrqError(f"unexpected error while talking to Redis: {exc!r}"))
            raise

    def _send(self, budgets: StepBudgets) -> None:
        """One round trip for the steps, retried on connection errors while any step's budget
        lasts (see StepBudgets); every step is settled, unless another error is raised."""
        try:
            budgets.answered(self._attempt(budgets.calls()))
            return
        except RedisUnavailable as exc:
            logger.debug("redis attempt failed, retrying error=%s", exc)
            budgets.failed(exc)
        if not budgets.live or budgets.handing_over():
            return
        self._retry(budgets)

    def _retry(self, budgets: StepBudgets) -> None:
        try:
            for attempt in Retrying(**budgets.retrying()):
                with attempt:
                    self.retries += 1
                    metrics.REDIS_RETRIES.inc()
                    budgets.answered(self._attempt(budgets.calls()))
        except RedisUnavailable:
            # each step was given up when its budget ran out, or the rest are handed over
            assert not budgets.live or budgets.handing_over()

    def _attempt(self, calls: Sequence[Call]) -> list[Reply]:
        # answers to one endpoint, and enqueues to one endpoint: one script call each
        sent, spread = merge_calls(calls)
        self.count(sent)
        replies = self._raw(sent)
        if _needs_scripts(replies):
            self.load_scripts()
            self.count(sent)
            replies = self._raw(sent)
        return spread(replies)

    def _raw(self, calls: Sequence[Call]) -> list[Reply]:
        """One round trip; error replies come back in place, transport errors raise."""
        link = self._take_link()
        try:
            with translate_errors():
                replies = link.round_trip(calls)
        except RedisUnavailable as exc:
            if self.redis_settings.tls and tls_eof(exc):
                refused = tls_probe(self.redis_settings)
                if refused is not None:
                    raise tls_configuration_error(refused) from exc
            if self._closed:  # (a round trip the close cut: not Redis failing)
                raise _closed_error() from exc
            self.reachability.failed(exc)
            raise
        finally:
            if not self._overlapping:  # (a cluster's one link is shared)
                with self._lock:
                    self._free.append(link)
        self.reachability.answered()
        return replies

    def _take_link(self) -> SyncLink | SyncClusterLink:
        """A link for one round trip: on a cluster the one link; on one server a connection no
        other round trip uses now (made when none is free: at most two, the leader's and the
        express step's)."""
        if self._overlapping:
            return self._links[0]
        with self._lock:
            if self._closed:
                raise QueueShutdown("the queue was closed while talking to Redis")
            if self._free:
                return self._free.pop()
            link = sync_link(self.client)
            self._links.append(link)
            return link

    def load_scripts(self) -> None:
        """SCRIPT LOAD every prq script (after a restart or SCRIPT FLUSH)."""
        logger.info("loading prq scripts into Redis")
        for result in _split([script_load_calls()], self._raw(script_load_calls())):
            if isinstance(result, PrqError):
                raise result

    def close(self) -> None:
        with self._lock:
            self._closed = True
            links = list(self._links)
        for link in links:
            link.close()
        close_client(self.client)
