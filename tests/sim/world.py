"""The simulated world: nodes of prq driven by one seeded scheduler against a real Redis.

A node is prq's own `QueueBase` (its sender and receiver halves, its watch: all of prq's logic
that is not I/O); what a facade adds, the simulation adds in the same way (`drive` is
AsyncDriver._run's loop, the operations below are the facade methods' bodies), with every
effect a flow yields handed to the scheduler instead of to a socket. At each step the scheduler
picks, by the seed, one thing that may happen next:

- a step's calls reach Redis (the scripts run), or they are lost on the way, or they run and
  their reply is lost (the link then sends them again, as prq's transport does, until its
  retry budget is spent and the flow gets QueueUnavailable); a reply that arrived is handed to
  its flow at some later step, while other flows move;
- a flow waiting on a pulse or a poll wakes (its signal fired, or its time came);
- a pulse Redis published reaches the nodes subscribed to its channel, or is dropped, or comes
  twice;
- a node's watch turn (beats, cancellations, data-loss checks) runs, when due or woken;
- an operation starts: a call, a send (a call whose outcome goes to one of two callbacks),
  a withdraw of a send, a one-way message (notify: queued in the bulk form, through
  enqueue_many.lua), a cancel, a status read, a dequeue on a receiver with a free slot, an
  answer;
- a task is cancelled at the yield it stands at (asyncio's CancelledError, thrown there), or
  its link gives up (QueueUnavailable, thrown there); cancels, closes and crashes come more
  often in the middle of an operation (Knobs.mid_step);
- a node closes (gracefully: giving back what it holds) or crashes (it stops, nothing runs);
- Redis loses everything (a flush; a restart, which also drops its scripts and every pub/sub
  link), or goes back to a snapshot of itself taken earlier in the run (a restart from an older
  RDB, a failover to a replica that missed writes: every key as it was then, with the expiry it
  had, the scripts and the pub/sub links dropped);
- time jumps (to the next deadline any flow waits for, or past a pickup window).

Time is virtual (tests/sim/clock.py): nothing waits for real, and a run of a seed is the same
run every time. The history (what ran where, what each caller was told) is checked at the
end, and the queue's own structure after every step (tests/sim/checks.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time as real_time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import redis
from redis.exceptions import NoScriptError

from prq.bulk import BulkClient
from prq.bulk.dedup import new_batch_nonce
from prq.bulk.watch import LossWatch
from prq.core.config import QueueSettings, RedisSettings
from prq.core.errors import (
    CancelledBeforePickup,
    PrqError,
    QueueUnavailable,
    SerializationError,
)
from prq.core.lifecycle import PendingRequest
from prq.core.models import Delivery, Request, Response
from prq.facade.send import SendState
from prq.node.base import QueueBase
from prq.node.guard import CheckDataLoss, guarded
from prq.node.watch import NodeWatch
from prq.protocol.effects import Call, Effect, Exec, Offload, Reply, Wait, attempt_calls
from prq.protocol.flows.call import call_flow
from prq.protocol.flows.cancel import cancel_flow, withdraw_own_flow
from prq.protocol.flows.status import status_flow
from prq.protocol.scripts.loading import ENQUEUE, ENQUEUE_MANY, TAKE
from prq.protocol.scripts.merging import merge_calls
from prq.transport.batches import IOCounters
from prq.transport.links import SyncLink
from prq.transport.pulse_router import PulseRouter
from prq.transport.signals import Signal
from prq.transport.translate import _reply_error
from tests.sim.clock import CLOCK_KEY, DUMP_SCRIPT, EXPIRE_SCRIPT, EXPIRY_FLOOR_MS, SimClock
from tests.sim.scripts import Plant, planted_class, planted_node_class, twin_call, twins_of

__all__ = ["ROLLBACKS", "Broken", "Knobs", "Outcome", "SimNode", "Task", "World", "sim_settings"]

#: How much time each step takes, seconds (a round trip on a fast link).
STEP_S = 0.0001

#: How often a step's calls are sent before the link gives up (QueueUnavailable): prq's
#: transport retries within a retry budget; here a count stands for it.
SEND_ATTEMPTS = 4

#: The steps (by their names' start) after which a live node may rightly go unheard for a
#: while: time jumping while it stood still, a step of it lost or given up, a cancel, a close
#: or a crash, Redis losing data (checks.py judges liveness verdicts away from these).
FAULTS = (
    "jump",
    "lose",
    "give up",
    "cancel",
    "close",
    "crash",
    "flush",
    "restart",
    "rollback",
    "corrupt",
)


class Broken(AssertionError):
    """A run broke a guarantee: what broke, and the steps that led there."""

    def __init__(self, world: World, problems: list[str]) -> None:
        self.world = world
        self.problems = problems
        super().__init__(f"seed {world.seed}, step {world.steps}: " + "; ".join(problems[:5]))


class CallerCrashed(Exception):
    """The outcome of a call whose node crashed while it waited: nobody was told anything."""


class SimSignal(Signal):
    """A signal the scheduler looks at (a wait on it is runnable once it fired)."""

    def _wake(self) -> None:
        pass


class SimPulses:
    """The pub/sub side of a node: which channels it listens to (the world delivers)."""

    def __init__(self) -> None:
        self.channels: set[bytes] = set()
        self.subscriptions = 0
        self.reconnects = 0

    def ensure_subscribed(self, channel: str) -> None:
        if channel.encode() not in self.channels:
            self.channels.add(channel.encode())
            self.subscriptions += 1


class SimNode(QueueBase):
    """prq's node, its I/O handed to the world."""

    def __init__(
        self, world: World, name: str, settings: QueueSettings, *, receiver: bool = False
    ) -> None:
        super().__init__(
            RedisSettings(url="redis://sim.invalid:6379/0"),
            prefix=world.prefix,
            settings=settings,
            node_id=name,
        )
        self.world = world
        self.name = name
        self._io = IOCounters()
        self.sim_pulses = SimPulses()
        self._pulses = self.sim_pulses  # type: ignore[assignment]
        self._router = PulseRouter(self.keys.node_channel(self.node_id), SimSignal)
        self.sim_pulses.ensure_subscribed(self.keys.node_channel(self.node_id))
        self._watch = NodeWatch(self.ctx, self._router)
        self.watch_woken = False
        self._watch.wake = self._wake_watch
        self.next_watch = 0.0
        self.crashed = False
        #: whether the world gives this node dequeues (a receiver) or calls (a sender)
        self.receiver = receiver
        #: every take reply this node was handed: (the step its take ran on Redis, the step it
        #: was handed, virtual time then); each tells the node the stamp that take wrote, so a
        #: rollback to before that take shows at its next take
        self.takes: list[tuple[int, int, float]] = []
        #: the step it started at
        self.started_at = 0
        #: tokens of takes cut short that an unpark under way gives back
        self.giving_back: set[str] = set()
        #: the requests its handler got that it has not answered yet
        self.answering: set[str] = set()

    def _wake_watch(self) -> None:
        self.watch_woken = True

    @property
    def alive(self) -> bool:
        return not self.crashed and not self._closed


@dataclass
class Outcome:
    """What a call's caller was told: its response, or the error it got."""

    response: Response | None = None
    error: BaseException | None = None


@dataclass
class CallRecord:
    request: Request
    node: str
    #: "call" (its caller waits for the answer), "send" (a call whose outcome goes to one of
    #: its callbacks), "notify" (one-way: told only that it is queued) or "bulk" (queued by a
    #: BulkClient, told only that it is queued; its outcomes read later)
    kind: str = "call"
    outcome: Outcome | None = None
    cancelled_by_sim: bool = False
    #: Redis's losses (flushes, restarts) so far when the call ended
    losses_at_end: int = 0
    #: Redis's losses so far at each run of its enqueue (more than one: the enqueue was sent
    #: again after a loss, its first reply lost, and queued the request afresh)
    enqueue_eras: set[int] = field(default_factory=set)
    #: the step its caller was told
    ended_at: int = -1
    #: its pickup window, and the virtual time its flow began (a call's and a send's; -1: not
    #: begun)
    pickup_s: float = 0.0
    started_t: float = -1.0
    #: a send's shared state (prq.facade.send.SendState, as its handle keeps it), whether
    #: its enqueue answered, what its callbacks were given (in order), and the outcome its
    #: task came to while a withdraw decided (SendHandle._run waits for the verdict then)
    send: SendState | None = None
    enqueued: bool = False
    callbacks: list[Response | PrqError] = field(default_factory=list)
    deferred: Outcome | None = None
    #: what each read of a bulk request's outcome told (BulkClient.outcomes, resolved), the
    #: step it was told at, and Redis's losses by then
    reads: list[tuple[Outcome, int, int]] = field(default_factory=list)


@dataclass
class BulkJob:
    """One writer of bulk requests (a Spark task, a script) on a sender node: its loss watch,
    the requests it queued, and whether a round trip of it is under way (a writer sends one at
    a time, as BulkClient does)."""

    node: SimNode
    watch: LossWatch = field(default_factory=LossWatch)
    records: list[CallRecord] = field(default_factory=list)
    busy: bool = False
    #: the step its first enqueue answered at (-1: none yet)
    first_at: int = -1


@dataclass
class Task:
    """One operation under way: a generator of effects, and where it stands."""

    node: SimNode
    kind: str
    gen: Generator[Effect, Any, Any]
    name: str
    #: "start" (not begun), "sent" (an Exec on its way), "replied" (its reply waits to be
    #: handed over), "wait" (on a signal or its time), "offload" (work to run), "done"
    phase: str = "start"
    effect: Effect | None = None
    attempts: int = 0
    reply: list[Reply] | BaseException | None = None
    deadline: float = 0.0
    on_done: Callable[[Any, BaseException | None], None] | None = None
    #: the call a "call" task makes (the requests a "bulk" task queues)
    call: CallRecord | None = None
    calls: list[CallRecord] = field(default_factory=list)
    #: the step its last step was sent at (what it carries was read then), the step its calls
    #: ran on Redis, and its last take's (sent, ran); -1: none yet
    sent_at: int = -1
    ran_at: int = -1
    #: the step its first calls ran on Redis (-1: none yet)
    first_ran_at: int = -1
    took_at: tuple[int, int] = (-1, -1)
    #: a dequeue's take under way: its token, while what it took is not yet sorted
    current: list[str] | None = None


@dataclass
class Knobs:
    """How often each kind of thing happens (weights for the scheduler's draw)."""

    arrive: float = 10.0
    deliver: float = 10.0
    lose_reply: float = 0.6
    lose_request: float = 0.3
    wake: float = 6.0
    pulse: float = 6.0
    pulse_drop: float = 0.5
    pulse_twice: float = 0.3
    watch: float = 2.0
    call: float = 2.0
    #: a one-way message (notify: queued in the bulk form, no answer kept), and a status read
    notify: float = 0.6
    status: float = 0.3
    #: a send (a call with callbacks), and a withdraw of a send on its way
    send: float = 0.6
    withdraw: float = 0.4
    #: a bulk enqueue (BulkClient, one to three requests in one round trip), and a read of the
    #: outcomes of requests it queued
    bulk: float = 0.4
    outcomes: float = 0.4
    bulk_jobs: int = 2
    cancel_call: float = 0.4
    dequeue: float = 3.0
    cancel_task: float = 0.3
    #: a step's link gives up at once (QueueUnavailable thrown into the flow where it waits;
    #: the step ran on Redis or not), as a retry budget spent on a dead link does
    give_up: float = 0.15
    #: how much likelier a cancel, a close or a crash lands while its task (its node's task)
    #: is in the middle of an operation: a step on its way or its reply not yet handed over,
    #: or a take returned and what it got not yet sorted; the moments where two round trips
    #: of one operation can be told apart
    mid_step: float = 4.0
    close: float = 0.08
    crash: float = 0.04
    flush: float = 0.03
    restart: float = 0.03
    #: a snapshot of Redis taken (kept for a later rollback), and Redis rolled back to it
    snapshot: float = 0.15
    rollback: float = 0.05
    #: a queued record's body overwritten with bytes that are not a request (malformed data)
    corrupt: float = 0.1
    jump: float = 0.6
    calls_max: int = 24
    #: a call's pickup window: short (a time jump passes it) or long
    pickup_windows: tuple[float, ...] = (0.3, 30.0)
    deliveries: tuple[Delivery, ...] = ("at_most_once", "at_least_once")
    priorities: tuple[int, ...] = (0, 1)
    take_sizes: tuple[int, ...] = (1, 2, 3)
    #: how long a handler runs (virtual seconds): most at once, some past the first beat, some
    #: past a receiver timeout (the node beats for them meanwhile)
    handler_s: tuple[float, ...] = (0.0, 0.0, 0.0, 0.5, 3.0, 6.0)
    #: the steps without faults after the run's own (new work still comes: up to quiet_calls
    #: more operations), before it settles
    quiet_steps: int = 200
    quiet_calls: int = 8
    #: whether, once the faults stop, time may move on past a watch turn that is due (so that
    #: a take can come before the node's data-loss check: what a receiver's stamp is for)
    late_turns: bool = False
    slots: int = 3
    senders: int = 2
    receivers: int = 2
    #: replacement receivers started over the run (after a close or a crash)
    restarts: int = 2


#: Schedules heavy with rollbacks (a snapshot of Redis kept, then Redis back to it), with fewer
#: watch turns and time jumps, and turns that may come late once the faults stop (so that takes
#: come between a rollback and the check that would show it), and no other loss.
ROLLBACKS = Knobs(
    snapshot=0.6,
    rollback=0.4,
    flush=0,
    restart=0,
    crash=0.01,
    corrupt=0,
    watch=0.5,
    jump=0.2,
    late_turns=True,
)


def sim_settings() -> QueueSettings:
    """Timings for the simulated nodes: short enough that a few jumps cross them."""
    return QueueSettings(
        poll_interval_s=0.5,
        dequeue_timeout_s=1.0,
        pickup_timeout_s=5.0,
        receiver_timeout_s=4.0,
        sender_timeout_s=4.0,
        handoff_confirm_s=1.0,
        max_attempts=3,
        list_ttl_s=120.0,
        data_loss_check_interval_s=2.0,
        retry_budget_s=2.0,
        shutdown_timeout_s=0.0,
    )


class World:
    """One simulation run: the nodes, their tasks, Redis, the clock, the seed's draws."""

    def __init__(
        self,
        client: redis.Redis,
        seed: int,
        *,
        knobs: Knobs | None = None,
        settings: QueueSettings | None = None,
        endpoint: str = "poll://sim",
        plant: Plant | None = None,
        clock: SimClock | None = None,
    ) -> None:
        """Build the world inside `virtual_time(clock)` (what `simulate` does): its nodes
        take their clocks when they are made."""
        self.client = client
        self.twins = twins_of(plant)
        self.node_class = planted_node_class(SimNode, plant)
        self.send_state_class = planted_class(SendState, plant)
        self.seed = seed
        self.rng = random.Random(seed)
        self.knobs = knobs or Knobs()
        self.settings = settings or sim_settings()
        self.endpoint = endpoint
        self.prefix = "prq"
        #: the BulkClient whose flows the bulk operations run (its own I/O is never used)
        self.bulk = BulkClient(
            RedisSettings(url="redis://sim.invalid:6379/0"),
            prefix=self.prefix,
            settings=self.settings,
        )
        self.clock = clock or SimClock()
        self.nodes: list[SimNode] = []
        self.tasks: list[Task] = []
        self.calls: dict[str, CallRecord] = {}
        #: request id -> the nodes whose handler got it (in order)
        self.runs: dict[str, list[str]] = {}
        self.pulses: list[tuple[bytes, bytes]] = []
        self.log: list[str] = []
        self.steps = 0
        self.losses = 0  # flushes, restarts and rollbacks so far
        #: the virtual time after each step (index: the step), and after each fault that can
        #: keep a live node from being heard (FAULTS, a failed watch turn)
        self.step_times: list[float] = [self.clock.monotonic()]
        self.fault_times: list[float] = []
        #: when each request's answer was first accepted (virtual time)
        self.answered_t: dict[str, float] = {}
        self.wipes = 0  # flushes and restarts so far (Redis left empty)
        self.wipe_steps: list[int] = []  # the step of each
        #: the bulk writers (`_start_bulk`), at most Knobs.bulk_jobs
        self.bulk_jobs: list[BulkJob] = []
        #: the last snapshot of Redis: (step, virtual time, key -> (DUMP, PTTL ms))
        self.snapshot: tuple[int, float, dict[bytes, tuple[bytes, int]]] | None = None
        #: every rollback: (the step of the snapshot it went back to, the step it came)
        self.rollbacks: list[tuple[int, int]] = []
        #: Redis's clock (ms) at the last rollback: records taken before may be of takes their
        #: nodes ended since (0: none yet)
        self.rolled_back_ms = 0
        #: request id -> each run, as `runs`: (node, the steps its take was sent and ran on
        #: Redis, virtual time when the handler got it)
        self.run_steps: dict[str, list[tuple[str, int, int, float]]] = {}
        self.restarts_left = self.knobs.restarts
        #: requests whose queued body the world overwrote (`_corrupt`)
        self.corrupted: set[str] = set()
        #: what an operation saw that it must not (checks.history_violations reports them)
        self.findings: list[str] = []
        #: the structure check's memory: each listed lane's ids when last seen, by (level,
        #: member); ids of lanes that expired still counted in their level's depth, by level;
        #: the losses when it was last cleared (checks.structure_violations)
        self.lanes_seen: dict[tuple[str, bytes], list[bytes]] = {}
        self.expired_counted: dict[str, set[bytes]] = {}
        self.lanes_seen_at = 0
        self.snapshot_lanes: tuple[dict[tuple[str, bytes], list[bytes]], dict[str, set[bytes]]] = (
            {},
            {},
        )
        self._serial = 0
        # (a link of its own: prq's, one round trip at a time, error replies in place)
        self._link = SyncLink(redis.ConnectionPool(**client.connection_pool.connection_kwargs))
        self._pubsub = client.pubsub()  # type: ignore[no-untyped-call, unused-ignore]
        self._pubsub.psubscribe("prq:*")
        self._drain_pubsub()
        self._expire = client.register_script(EXPIRE_SCRIPT)
        self._dump = client.register_script(DUMP_SCRIPT)
        self._real_synced = real_time.monotonic()
        self.faults = True
        #: the steps after the faults, where new work still comes (`run`)
        self.quiet = False
        #: whether a record's state must agree with where it sits (checks.structure_violations)
        self.strict = True
        self._write_clock()
        self._load_scripts()
        for n in range(self.knobs.senders):
            self.add_node(f"s{n}")
        for n in range(self.knobs.receivers):
            self.add_node(f"r{n}", receiver=True)

    # -- the world's parts --------------------------------------------------------------------

    def add_node(self, name: str, *, receiver: bool = False) -> SimNode:
        node = self.node_class(self, name, self.settings, receiver=receiver)
        node.started_at = self.steps
        self.nodes.append(node)
        self.note(f"node {name} starts")
        return node

    def note(self, text: str) -> None:
        self.log.append(f"{self.steps:5d} t={self.clock.elapsed:8.3f} {text}")

    def spawn(
        self,
        node: SimNode,
        kind: str,
        gen: Generator[Effect, Any, Any],
        on_done: Callable[[Any, BaseException | None], None] | None = None,
    ) -> Task | None:
        if node.crashed:
            gen.close()
            return None
        self._serial += 1
        task = Task(node, kind, gen, f"{kind}#{self._serial}@{node.name}", on_done=on_done)
        self.tasks.append(task)
        return task

    def _write_clock(self) -> None:
        seconds, micros = self.clock.server_time()
        self.client.hset(CLOCK_KEY, mapping={"s": seconds, "us": micros})

    def _load_scripts(self) -> None:
        self._round_trip(
            [Call(("SCRIPT", "LOAD", twin.source), twin) for twin in self.twins.values()]
        )

    def _round_trip(self, calls: list[Call]) -> list[Reply]:
        return self._link.round_trip(calls)

    def run_calls(self, calls: tuple[Call, ...] | list[Call]) -> list[Reply]:
        """One step's calls on Redis, as prq's link sends them (merged, scripts loaded when
        Redis lost them); the replies, error replies in place. Pulses published meanwhile are
        collected."""
        sent, spread = merge_calls(list(calls))
        twins = [twin_call(call, self.twins) for call in sent]
        replies = self._round_trip(twins)
        if any(isinstance(reply, NoScriptError) for reply in replies):
            self._load_scripts()
            replies = self._round_trip(twins)
        self._drain_pubsub()
        return spread(replies)

    def run_task_calls(self, task: Task, effect: Exec) -> list[Reply]:
        """`run_calls` for a task's step; a call's enqueue is noted with the losses so far."""
        task.ran_at = self.steps
        if task.first_ran_at < 0:
            task.first_ran_at = self.steps
        if any(
            c.script is not None and c.script.sha in (ENQUEUE.sha, ENQUEUE_MANY.sha)
            for c in effect.calls
        ):
            for record in [task.call] if task.call is not None else task.calls:
                record.enqueue_eras.add(self.losses)
        # (an attempt after the first sends a call's resend, as the transports do)
        return self.run_calls(attempt_calls(effect.calls))

    def _drain_pubsub(self) -> None:
        """Collect what Redis published so far: a PING on the subscriber link comes back after
        every message published before it."""
        self._pubsub.ping()
        for _ in range(100_000):
            message = self._pubsub.get_message(timeout=5.0)
            if message is None:
                raise AssertionError("the pub/sub link did not answer its PING")
            if message["type"] == "pong":
                return
            if message["type"] == "pmessage":
                self.pulses.append((message["channel"], message["data"]))
        raise AssertionError("too many pulses")

    def step_result(self, calls: tuple[Call, ...] | list[Call]) -> list[Reply] | PrqError:
        replies = self.run_calls(calls)
        error = next((r for r in replies if isinstance(r, Exception)), None)
        return _reply_error(error) if error is not None else replies

    # -- the scheduler ------------------------------------------------------------------------

    def choices(self) -> list[tuple[float, str, Callable[[], None]]]:  # noqa: C901
        k = self.knobs
        now = self.clock.monotonic()
        options: list[tuple[float, str, Callable[[], None]]] = []
        faults = self.faults
        for task in self.tasks:
            if task.phase == "start" or task.phase == "offload":
                options.append((k.deliver, f"resume {task.name}", partial(self._resume, task)))
            elif task.phase == "sent":
                options.append((k.arrive, f"arrive {task.name}", partial(self._arrive, task)))
                if faults:
                    options.append(
                        (k.lose_reply, f"lose reply {task.name}", partial(self._lose, task, True))
                    )
                    options.append(
                        (k.lose_request, f"lose {task.name}", partial(self._lose, task, False))
                    )
                    options.append(
                        (k.give_up, f"give up {task.name}", partial(self._give_up, task))
                    )
            elif task.phase == "replied":
                options.append((k.deliver, f"deliver {task.name}", partial(self._deliver, task)))
            elif task.phase == "wait":
                effect = task.effect
                assert isinstance(effect, Wait)
                if effect.signal.generation != effect.seen or now >= task.deadline:
                    options.append((k.wake, f"wake {task.name}", partial(self._resume, task)))
            if faults and task.kind in ("call", "notify", "dequeue") and task.phase != "start":
                weight = k.cancel_task * (k.mid_step if _mid_step(task) else 1.0)
                options.append((weight, f"cancel {task.name}", partial(self._cancel_task, task)))
        if self.pulses:
            options.append((k.pulse, "pulse", partial(self._pulse, "deliver")))
            if faults:
                options.append((k.pulse_drop, "drop pulse", partial(self._pulse, "drop")))
                options.append((k.pulse_twice, "pulse twice", partial(self._pulse, "twice")))
        for node in self.nodes:
            if not node.alive:
                continue
            if node.watch_woken or now >= node.next_watch:
                options.append((k.watch, f"watch {node.name}", partial(self._watch_turn, node)))
            if node.receiver and not node.closed:
                busy = sum(1 for t in self.tasks if t.node is node and t.kind == "dequeue")
                if busy < k.slots:
                    options.append(
                        (k.dequeue, f"dequeue {node.name}", partial(self._start_dequeue, node))
                    )
            if faults and not node.closed:
                mid = any(t.node is node and _mid_step(t) for t in self.tasks)
                boost = k.mid_step if mid else 1.0
                options.append((k.close * boost, f"close {node.name}", partial(self._close, node)))
                options.append((k.crash * boost, f"crash {node.name}", partial(self._crash, node)))
        senders = [n for n in self.nodes if not n.receiver and not n.closed]
        work = faults or self.quiet  # (new work comes in the quiet steps too)
        most = k.calls_max + (k.quiet_calls if self.quiet else 0)
        if work and senders and len(self.calls) < most:
            options.append((k.call, "call", partial(self._start_call, self.rng.choice(senders))))
            options.append(
                (k.notify, "notify", partial(self._start_notify, self.rng.choice(senders)))
            )
            options.append((k.send, "send", partial(self._start_send, self.rng.choice(senders))))
            options.append((k.bulk, "bulk", partial(self._start_bulk, senders)))
        if faults and senders and self.calls:
            options.append((k.cancel_call, "cancel call", partial(self._start_cancel, senders)))
        if work and senders and self.calls:
            options.append((k.status, "status", partial(self._start_status, senders)))
        readable = [j for j in self.bulk_jobs if not j.busy and j.node.alive and j.records]
        if work and readable:
            options.append((k.outcomes, "outcomes", partial(self._start_outcomes, readable)))
        withdrawable = [r for r in self.calls.values() if _withdrawable(self, r)]
        if work and withdrawable:
            options.append(
                (
                    k.withdraw,
                    "withdraw",
                    partial(self._start_withdraw, self.rng.choice(withdrawable)),
                )
            )
        if faults:
            options.append((k.flush, "flush", partial(self._lose_data, restart=False)))
            options.append((k.restart, "restart", partial(self._lose_data, restart=True)))
            options.append((k.snapshot, "snapshot", self._take_snapshot))
            if self.snapshot is not None:
                options.append((k.rollback, "rollback", self._roll_back))
            options.append((k.jump, "jump", self._jump))
            options.append((k.corrupt, "corrupt", self._corrupt))
        # (without faults time moves on only once nothing is due, no watch turn either, unless
        # the knobs let turns come late: a move past a due watch turn is then noted as a
        # fault, `_to_next_deadline`)
        punctual = not faults and not k.late_turns
        due = ("resume", "arrive", "deliver", "wake") + (("watch",) if punctual else ())
        if not any(o[1].startswith(due) for o in options):
            options.append((1.0, "time", self._to_next_deadline))
        return options

    def _give_time_back(self) -> None:
        """Lengthen every TTL by the real time that passed since the last step (Redis's clock
        moved, virtual time did not)."""
        lag_ms = int((real_time.monotonic() - self._real_synced) * 1000)
        if lag_ms > 0:
            self._expire(args=[-lag_ms, 0])
            self._real_synced += lag_ms / 1000

    def step(self) -> None:
        # (each step is at least a round trip: time never stands still, so that numbers drawn
        # from the server's clock in one step, a take's stamp, an enqueue's sequence number,
        # stay below those of a later step, as they do on a server; its TTLs are left alone)
        self.clock.advance(STEP_S)
        self._write_clock()
        self._give_time_back()
        options = self.choices()
        weights = [o[0] for o in options]
        _, what, action = self.rng.choices(options, weights)[0]
        self.steps += 1
        action()
        self.step_times.append(self.clock.monotonic())
        if what.startswith(FAULTS):
            self.fault_times.append(self.clock.monotonic())
        if not what.startswith(("resume", "wake", "deliver")):
            self.note(what)

    # -- tasks --------------------------------------------------------------------------------

    def _advance(self, task: Task, send: Callable[[], Effect]) -> None:
        """Run a task to its next effect (Offload runs on its next step)."""
        try:
            effect = send()
        except StopIteration as stop:
            self._finish(task, stop.value, None)
            return
        except BaseException as exc:  # (a task's end: its error is its outcome)
            self._finish(task, None, exc)
            return
        task.effect = effect
        task.reply = None
        if isinstance(effect, Exec):
            task.phase, task.attempts, task.sent_at = "sent", 0, self.steps
        elif isinstance(effect, Wait):
            task.phase = "wait"
            task.deadline = self.clock.monotonic() + effect.timeout_s
        elif isinstance(effect, Offload):
            task.phase = "offload"
        else:
            raise AssertionError(f"unknown effect {effect!r}")

    def _finish(self, task: Task, value: Any, error: BaseException | None) -> None:
        task.phase = "done"
        with contextlib.suppress(ValueError):
            self.tasks.remove(task)
        if error is not None and not isinstance(error, (PrqError, asyncio.CancelledError)):
            raise error  # a bug in a flow, or in the simulation: let it show
        if task.on_done is not None:
            task.on_done(value, error)

    def _resume(self, task: Task) -> None:
        if task.phase == "start" and task.call is not None:
            task.call.started_t = self.clock.monotonic()  # (its flow reads its clock now)
        if task.phase == "offload":
            effect = task.effect
            assert isinstance(effect, Offload)
            try:
                value = effect.work()
            except PrqError as exc:
                self._advance(task, partial(task.gen.throw, exc))
                return
            self._advance(task, partial(task.gen.send, value))
            return
        self._advance(task, partial(task.gen.send, None))

    def _arrive(self, task: Task) -> None:
        effect = task.effect
        assert isinstance(effect, Exec)
        task.reply = self.run_task_calls(task, effect)
        task.phase = "replied"

    def _lose(self, task: Task, ran: bool) -> None:
        effect = task.effect
        assert isinstance(effect, Exec)
        if ran:
            self.run_task_calls(task, effect)
        task.attempts += 1
        if task.attempts >= SEND_ATTEMPTS:
            self._advance(
                task,
                partial(
                    task.gen.throw,
                    QueueUnavailable("Redis did not answer within the retry budget"),
                ),
            )

    def _give_up(self, task: Task) -> None:
        effect = task.effect
        assert isinstance(effect, Exec)
        if self.rng.random() < 0.5:
            self.run_task_calls(task, effect)
        self._advance(
            task, partial(task.gen.throw, QueueUnavailable("the link gave up (simulated)"))
        )

    def _deliver(self, task: Task) -> None:
        replies = task.reply
        assert isinstance(replies, list)
        error = next((r for r in replies if isinstance(r, Exception)), None)
        effect = task.effect
        if (
            error is None
            and isinstance(effect, Exec)
            and any(c.script is not None and c.script.sha == TAKE.sha for c in effect.calls)
        ):
            task.took_at = (task.sent_at, task.ran_at)
            task.node.takes.append((task.ran_at, self.steps, self.clock.monotonic()))
        if error is not None:
            self._advance(task, partial(task.gen.throw, _reply_error(error)))
        else:
            self._advance(task, partial(task.gen.send, replies))

    def _cancel_task(self, task: Task) -> None:
        """asyncio's cancel, where the task stands: a step it sent may still reach Redis (its
        write had left), or not."""
        if task.phase == "sent" and self.rng.random() < 0.5:
            effect = task.effect
            assert isinstance(effect, Exec)
            self.run_task_calls(task, effect)
        self._advance(task, partial(task.gen.throw, asyncio.CancelledError()))

    # -- pulses, watch turns, nodes, Redis, time ----------------------------------------------

    def _pulse(self, how: str) -> None:
        index = self.rng.randrange(len(self.pulses))
        channel, data = self.pulses[index]
        if how != "twice":
            del self.pulses[index]
        if how == "drop":
            return
        for node in self.nodes:
            if node.alive and channel in node.sim_pulses.channels:
                node._router.dispatch(channel, data)

    def _watch_turn(self, node: SimNode) -> None:
        node.watch_woken = False
        now = self.clock.monotonic()
        plan = node._watch.plan(now)
        if plan.steps:
            if self.faults and self.rng.random() < 0.05:
                node._watch.forget(plan)  # (the round trip failed)
                self.fault_times.append(now)
            else:
                results = [self.step_result(calls) for calls in plan.steps]
                node._watch.settle(plan, results, self.clock.monotonic())
        node.next_watch = self.clock.monotonic() + node._watch.wait_s(self.clock.monotonic())

    def check_data_loss_now(self, node: SimNode) -> None:
        """AsyncDriver._check_data_loss_now: a call found its request gone."""
        plan = node._watch.plan(self.clock.monotonic(), check_only=True)
        results = [self.step_result(calls) for calls in plan.steps]
        node._watch.settle(plan, results, self.clock.monotonic())

    def _close(self, node: SimNode) -> None:
        self.spawn(node, "close", close_op(node))

    def _crash(self, node: SimNode) -> None:
        node.crashed = True
        node._closed = True
        for record in self.calls.values():
            if record.node == node.name and record.outcome is None:
                record.outcome = Outcome(error=CallerCrashed(node.name))
        for task in [t for t in self.tasks if t.node is node]:
            self.tasks.remove(task)
            task.phase = "done"
            task.on_done = None
            task.gen.close()  # (its clean-up code touches only this dead node)
        self._replace(node)

    def _replace(self, node: SimNode) -> None:
        if node.receiver and self.restarts_left > 0:
            self.restarts_left -= 1
            self.add_node(f"{node.name}'", receiver=True)

    def _lose_data(self, *, restart: bool) -> None:
        self.client.flushall()
        self.losses += 1
        self.wipes += 1
        self.wipe_steps.append(self.steps)
        if restart:
            self.client.script_flush()
            self.pulses.clear()
            for node in self.nodes:
                if node.alive:
                    node._router.reconnected()
        self._write_clock()

    def _take_snapshot(self) -> None:
        """Keep Redis as it is now, every key with its TTL (the clock key apart), read in one
        script: keys that expire together (written in one script) keep one TTL, so that a
        rollback brings back all of them or none (read one round trip apart, their TTLs would
        differ by the real time between, and a rollback near their end could bring back a
        level's depth without the lane it counts)."""
        found = self._dump(args=[CLOCK_KEY])
        kept: dict[bytes, tuple[bytes, int]] = {}
        for i in range(0, len(found), 3):
            kept[found[i]] = (found[i + 1], int(found[i + 2]))
        self.snapshot = (self.steps, self.clock.monotonic(), dict(sorted(kept.items())))
        # (and the structure check's memory of the lanes as they were: a rollback brings it back)
        self.snapshot_lanes = (
            dict(self.lanes_seen),
            {p: set(ids) for p, ids in self.expired_counted.items()},
        )

    def _roll_back(self) -> None:
        """Redis restarts from the last snapshot: what it held then, each key expiring when it
        would have (those whose time passed are gone); scripts and pub/sub links lost."""
        assert self.snapshot is not None
        step, taken_at, kept = self.snapshot
        self.client.flushall()
        self.client.script_flush()
        passed_ms = int((self.clock.monotonic() - taken_at) * 1000)
        for key, (dumped, ttl) in kept.items():
            left = 0 if ttl == -1 else ttl - passed_ms
            if ttl == -1 or left > EXPIRY_FLOOR_MS:
                self.client.restore(key, left, dumped)
        self.losses += 1
        self.rollbacks.append((step, self.steps))
        self.rolled_back_ms = round(self.clock.wall() * 1000)
        seen, counted = self.snapshot_lanes
        self.lanes_seen = dict(seen)
        self.expired_counted = {p: set(ids) for p, ids in counted.items()}
        self.lanes_seen_at = self.losses
        self.pulses.clear()
        for node in self.nodes:
            if node.alive:
                node._router.reconnected()
        self._write_clock()

    def _corrupt(self) -> None:
        """Overwrite one queued record's body with bytes that are no request: its receiver
        must dead-letter it and answer its caller with an error, never run it."""
        keys = self.nodes[0].keys.endpoint(self.endpoint)
        base = len(keys.request(""))
        found: list[bytes] = self.client.keys(keys.request("*"))  # type: ignore[assignment]
        queued = [
            key.decode()
            for key in sorted(found)
            if self.client.type(key) == b"hash"
            and self.client.hget(key, "st") == b"queued"
            and key.decode()[base:] not in self.runs  # (a redelivery ran before)
        ]
        if queued:
            key = self.rng.choice(queued)
            self.client.hdel(key, "bk")
            self.client.hset(key, "b", b"\xff not a request")
            self.corrupted.add(key[base:])

    def _jump(self) -> None:
        self._move_time(self.rng.choice((0.2, 0.6, 1.5, 5.0)))

    def _to_next_deadline(self) -> None:
        now = self.clock.monotonic()
        times = [t.deadline for t in self.tasks if t.phase == "wait"]
        times += [n.next_watch for n in self.nodes if n.alive]
        later = [t for t in times if t > now]
        self._move_time((min(later) - now) if later else 1.0)
        if any(n.alive and (n.watch_woken or now >= n.next_watch) for n in self.nodes):
            self.fault_times.append(self.clock.monotonic())  # (a node's turn came late)

    def _move_time(self, seconds: float) -> None:
        seconds = max(seconds, 0.001)
        self.clock.advance(seconds)
        self._give_time_back()
        self._expire(args=[max(1, int(seconds * 1000)), EXPIRY_FLOOR_MS])
        self._write_clock()

    # -- operations ---------------------------------------------------------------------------

    def _new_request(self) -> tuple[Request, float]:
        """A request for a call or a message, as the knobs draw it, and its pickup window."""
        k = self.knobs
        request = Request(
            endpoint=self.endpoint,
            method="echo",
            params=f"p{len(self.calls)}",
            delivery=self.rng.choice(k.deliveries),
            priority=self.rng.choice(k.priorities),
        )
        return request, self.rng.choice(k.pickup_windows)

    def _start_call(self, node: SimNode) -> None:
        request, pickup = self._new_request()
        record = CallRecord(request, node.name, pickup_s=pickup)
        self.calls[request.id] = record

        def done(value: Any, error: BaseException | None) -> None:
            record.outcome = Outcome(value if error is None else None, error)
            record.losses_at_end = self.losses
            record.ended_at = self.steps

        task = self.spawn(node, "call", call_op(node, request, pickup), done)
        if task is not None:
            task.call = record

    def _start_notify(self, node: SimNode) -> None:
        request, pickup = self._new_request()
        record = CallRecord(request, node.name, kind="notify")
        self.calls[request.id] = record

        def done(value: Any, error: BaseException | None) -> None:
            record.outcome = Outcome(None, error)
            record.losses_at_end = self.losses
            record.ended_at = self.steps

        task = self.spawn(node, "notify", notify_op(node, request, pickup), done)
        if task is not None:
            task.call = record

    def _start_send(self, node: SimNode) -> None:
        """AsyncQueue.send: the call runs in a task of its own; its outcome fires one
        callback (SendHandle._run)."""
        request, pickup = self._new_request()
        record = CallRecord(request, node.name, kind="send", pickup_s=pickup)
        record.send = self.send_state_class(
            request, record.callbacks.append, record.callbacks.append
        )
        self.calls[request.id] = record

        def enqueued() -> None:
            record.enqueued = True

        def done(value: Any, error: BaseException | None) -> None:
            outcome = Outcome(value if error is None else None, error)
            state = record.send
            assert state is not None
            if isinstance(error, PrqError) and state.withdrawing:
                record.deferred = outcome  # (until the withdraw says whether it withdrew)
                return
            _fire(self, record, outcome)

        task = self.spawn(node, "send", call_op(node, request, pickup, enqueued), done)
        if task is not None:
            task.call = record

    def _start_withdraw(self, record: CallRecord) -> None:
        """SendHandle.withdraw, once its send's enqueue answered (before, it waits for that)."""
        node = next(n for n in self.nodes if n.name == record.node)
        state = record.send
        assert state is not None
        state.withdrawing = True  # (set as withdraw() runs, before its first step)

        def done(value: Any, error: BaseException | None) -> None:
            state.withdrawn = bool(value) and error is None and not state.fired
            state.withdrawing = False
            if state.withdrawn:
                self.note(f"send {record.request.id} withdrawn")
                told = CancelledBeforePickup(
                    "withdrawn by its sender",
                    request_id=record.request.id,
                    endpoint=record.request.endpoint,
                )
                record.outcome = Outcome(None, told)
                record.losses_at_end = self.losses
                record.ended_at = self.steps
            if record.deferred is not None:
                outcome, record.deferred = record.deferred, None
                _fire(self, record, outcome)

        flow = withdraw_own_flow(node.ctx, record.request.endpoint, record.request.id)
        if self.spawn(node, "withdraw", drive(node, flow), done) is None:
            state.withdrawing = False

    def _start_bulk(self, senders: list[SimNode]) -> None:
        """BulkClient.enqueue_many of one to three requests with its writer's loss watch (one
        batch: one round trip, after the layout check of the endpoint's first use), by an idle
        writer, or a new one on a sender."""
        idle = [j for j in self.bulk_jobs if not j.busy and j.node.alive and not j.node.closed]
        if idle and (len(self.bulk_jobs) >= self.knobs.bulk_jobs or self.rng.random() < 0.5):
            job = self.rng.choice(idle)
        elif len(self.bulk_jobs) < self.knobs.bulk_jobs:
            job = BulkJob(self.rng.choice(senders))
            self.bulk_jobs.append(job)
        else:
            return
        node = job.node
        drawn = [self._new_request() for _ in range(self.rng.randint(1, 3))]
        records = []
        for request, _ in drawn:
            record = CallRecord(request, node.name, kind="bulk")
            self.calls[request.id] = record
            records.append(record)

        def done(value: Any, error: BaseException | None) -> None:
            job.busy = False
            for record in records:
                record.outcome = Outcome(None, error)
                record.losses_at_end = self.losses
                record.ended_at = self.steps
            if error is None:
                job.records += records
                if job.first_at < 0:
                    job.first_at = self.steps

        by_lane, rejected = self.bulk._encode_batch([request for request, _ in drawn])
        assert not rejected
        flow = self.bulk._send_flow(
            by_lane, drawn[0][1], new_batch_nonce(), locators=False, watch=job.watch
        )
        task = self.spawn(node, "bulk", drive(node, flow), done)
        if task is not None:
            job.busy = True
            task.calls = records

    def _start_outcomes(self, jobs: list[BulkJob]) -> None:
        """BulkClient.outcomes, with its watch, of some requests a writer queued (those overdue
        are withdrawn), each snapshot resolved as a reader would; what the watch says is
        judged against Redis's losses."""
        job = self.rng.choice(jobs)
        chosen = self.rng.sample(job.records, min(len(job.records), self.rng.randint(1, 3)))
        ids = [record.request.id for record in chosen]
        job.busy = True
        task: Task | None = None

        def done(value: Any, error: BaseException | None) -> None:
            job.busy = False
            if error is not None or task is None:
                return
            self._read_outcomes(job, chosen, value, task.first_ran_at)

        flow = self.bulk.outcomes_flow(self.endpoint, ids, watch=job.watch)
        task = self.spawn(job.node, "outcomes", drive(job.node, flow), done)
        if task is None:
            job.busy = False

    def _read_outcomes(
        self, job: BulkJob, chosen: list[CallRecord], found: dict[str, Any], read_at: int
    ) -> None:
        """Judge what a read of outcomes (its watch's step ran at step `read_at`) told."""
        if job.watch.lost and self.losses == 0:
            self.findings.append(f"a bulk loss watch saw a loss at step {self.steps}, none came")
        wiped = [s for s in self.wipe_steps if job.first_at < s < read_at]
        if not job.watch.lost and job.first_at >= 0 and wiped:
            self.findings.append(
                f"a bulk loss watch read at step {read_at} saw no loss, after Redis was wiped "
                f"at step {wiped[0]} (its writer's first batch answered at {job.first_at})"
            )
        for record in chosen:
            snapshot = found[record.request.id]
            if snapshot.state == "missing":
                continue  # (expired, or lost: what the watch says is judged above)
            try:
                response = self.bulk.resolve(snapshot, record.request.id, self.endpoint)
            except PrqError as exc:
                record.reads.append((Outcome(None, exc), self.steps, self.losses))
            else:
                if response is not None:
                    record.reads.append((Outcome(response, None), self.steps, self.losses))

    def _start_status(self, senders: list[SimNode]) -> None:
        node = self.rng.choice(senders)
        request_id = self.rng.choice(list(self.calls))

        def done(value: Any, error: BaseException | None) -> None:
            if isinstance(error, SerializationError) and request_id not in self.corrupted:
                self.findings.append(f"status of {request_id} failed: {error}")

        self.spawn(node, "status", status_op(node, request_id), done)

    def _start_cancel(self, senders: list[SimNode]) -> None:
        node = self.rng.choice(senders)
        request_id = self.rng.choice(list(self.calls))  # (in the order made: ids are random)
        record = self.calls[request_id]
        record.cancelled_by_sim = True
        self.spawn(node, "cancel", cancel_op(node, request_id, record.request.endpoint))

    def _start_dequeue(self, node: SimNode) -> None:
        size = self.rng.choice(self.knobs.take_sizes)

        task: Task | None = None

        def done(value: Any, error: BaseException | None) -> None:
            sent, ran = task.took_at if task is not None else (self.steps, self.steps)
            for pending in value or ():
                self.runs.setdefault(pending.id, []).append(node.name)
                self.run_steps.setdefault(pending.id, []).append(
                    (node.name, sent, ran, self.clock.monotonic())
                )
                node.answering.add(pending.id)
                run_s = self.rng.choice(self.knobs.handler_s)
                self.spawn(node, "answer", answer_op(node, pending, run_s))

        current: list[str] = []
        task = self.spawn(node, "dequeue", dequeue_op(node, self.endpoint, size, current), done)
        if task is not None:
            task.current = current

    # -- a directed schedule (a test names each step) --------------------------------------------

    def play(self, task: Task, until: Callable[[], bool], limit: int = 200) -> None:
        """Move `task` alone, each of its effects served at once (a wait woken at its time),
        until `until()` holds or the task ends; at most `limit` steps."""
        for _ in range(limit):
            if until() or task.phase == "done":
                return
            self.steps += 1
            if task.phase in ("start", "offload"):
                self._resume(task)
            elif task.phase == "sent":
                self._arrive(task)
            elif task.phase == "replied":
                self._deliver(task)
            elif task.phase == "wait":
                effect = task.effect
                assert isinstance(effect, Wait)
                if effect.signal.generation == effect.seen:
                    self._move_time(task.deadline - self.clock.monotonic())
                self._resume(task)
        raise AssertionError(f"{task.name} did not get there in {limit} steps")

    # -- a run ----------------------------------------------------------------------------------

    def run(self, steps: int, settle_steps: int = 4000) -> None:
        """`steps` steps with faults; then Knobs.quiet_steps without faults, new work still
        coming (where the liveness rule of checks.py can judge: nothing keeps a live node from
        being heard); then up to `settle_steps` without new work either: nothing lost or cut
        short, receivers taking, time moving, until every call has its outcome (and every task
        ended)."""
        for _ in range(steps):
            self.step()
            self.check()
        self.faults, self.quiet = False, True
        self.note("quiet")
        for _ in range(self.knobs.quiet_steps):
            if not self._working():
                break  # (no sender or no receiver left: nothing to judge, only time passing)
            self.step()
            self.check()
        self.quiet = False
        self.settle(settle_steps)

    def _working(self) -> bool:
        """Whether a sender and a receiver are up (new work can come and be taken)."""
        up = [n for n in self.nodes if n.alive and not n.closed]
        return any(n.receiver for n in up) and any(not n.receiver for n in up)

    def settle(self, steps: int) -> None:
        self.faults = False
        self.note("settling")
        if not any(n.receiver and n.alive and not n.closed for n in self.nodes):
            self.add_node("r-settle", receiver=True)
        for _ in range(steps):
            if self.settled():
                return
            self.step()
            self.check()

    def settled(self) -> bool:
        """Every call has its outcome, and every task has ended but the receivers' takes,
        which wait for work (a poll, or a pulse)."""
        calls_done = all(record.outcome is not None for record in self.calls.values())
        busy = [t for t in self.tasks if t.kind != "dequeue" or t.phase != "wait"]
        return calls_done and not busy

    def check(self) -> None:
        """The queue's structure after a step (tests/sim/checks.py); a break ends the run."""
        from tests.sim.checks import structure_violations

        problems = structure_violations(self, strict=self.strict)
        if problems:
            raise Broken(self, problems)

    @contextlib.contextmanager
    def running(self) -> Iterator[World]:
        from tests.sim.clock import virtual_time

        with virtual_time(self.clock):
            yield self

    def close(self) -> None:
        for task in list(self.tasks):
            task.on_done = None
            task.gen.close()
        self.tasks.clear()
        self._pubsub.close()
        self._link.close()
        self.bulk.close()


def _withdrawable(world: World, record: CallRecord) -> bool:
    """Whether a send may be withdrawn now: its enqueue answered, its outcome not yet fired,
    no withdraw of it deciding, its node up (SendHandle.withdraw returns at once otherwise)."""
    state = record.send
    if state is None or not record.enqueued or state.fired or state.withdrawn:
        return False
    node = next(n for n in world.nodes if n.name == record.node)
    return not state.withdrawing and node.alive and not node.closed and record.outcome is None


def _fire(world: World, record: CallRecord, outcome: Outcome) -> None:
    """A send's task ended with `outcome`: SendHandle._run's claim and callback."""
    state = record.send
    assert state is not None
    error = outcome.error
    if not isinstance(error, PrqError) and error is not None:
        # (a cancel or a crash of its task: no callback runs; its caller is gone)
        if record.outcome is None:
            record.outcome, record.losses_at_end, record.ended_at = (
                outcome,
                world.losses,
                world.steps,
            )
        return
    if not state.claim():
        return
    callback, value = state.callback(outcome.response, error)
    callback(value)
    if record.outcome is None or not state.withdrawn:
        record.outcome, record.losses_at_end, record.ended_at = outcome, world.losses, world.steps


def _mid_step(task: Task) -> bool:
    """Whether `task` is in the middle of an operation (Knobs.mid_step)."""
    return task.phase in ("sent", "replied") or (task.kind == "dequeue" and task.took_at[0] >= 0)


# -- what the facades do, as generators of effects ----------------------------------------------


def drive(
    node: SimNode,
    flow: Generator[Effect, Any, Any],
    mark: Any = None,
    *,
    closing_ok: bool = False,
) -> Generator[Effect, Any, Any]:
    """A facade driver's `_run`: prq's own `guarded(node, flow)` (the rules every driver runs
    a flow under), its effects handed to the scheduler; its data-loss check done at once."""
    steps = guarded(node, flow, mark, closing_ok=closing_ok)
    reply: object = None
    error: PrqError | None = None
    while True:
        try:
            effect = steps.throw(error) if error is not None else steps.send(reply)
        except StopIteration as stop:
            return stop.value
        error, reply = None, None
        if isinstance(effect, CheckDataLoss):
            node.world.check_data_loss_now(node)
            continue
        try:
            reply = yield effect
        except PrqError as exc:
            error = exc
        except BaseException:  # (a cancel where the flow waits: its clean-up now, as there)
            steps.close()
            raise


def call_op(
    node: SimNode,
    request: Request,
    pickup_s: float,
    on_enqueued: Callable[[], None] | None = None,
) -> Generator[Effect, Any, Response]:
    """AsyncSender._enqueue_and_wait (no DataStreams, no large bodies)."""
    request, body = node._encode_request(request)
    node._sending(request, None)
    mark = node._watch.mark(request.endpoint)
    try:
        with node._router.watch_response(request.id) as signal:
            flow = call_flow(
                node.ctx,
                request,
                body,
                signal,
                pickup_s,
                None,
                partial(node._enqueued, mark, then=on_enqueued),
                partial(node._redelivered, request.endpoint),
                register=node._first_use(request.endpoint),
                layout=node._check_layout_flow(request.endpoint),
                stamps=node._watch.stamps(mark),
            )
            response: Response = yield from drive(node, flow, mark)
    except BaseException as exc:
        if isinstance(exc, asyncio.CancelledError) and not node._closed:
            node.world.spawn(node, "withdraw", withdraw_op(node, request))
        raise
    finally:
        node._watch.liveness.release(request.id)
    return response


def notify_op(node: SimNode, request: Request, pickup_s: float) -> Generator[Effect, Any, str]:
    """AsyncSender.notify (no large bodies)."""
    request, body = node._encode_request(request)
    request_id: str = yield from drive(node, node._notify_flow(request, body, pickup_s))
    return request_id


def status_op(node: SimNode, request_id: str) -> Generator[Effect, Any, Any]:
    """AsyncSender.status."""
    flow = status_flow(node.ctx, request_id, node._sent_endpoint(request_id))
    return (yield from drive(node, flow))


def withdraw_op(node: SimNode, request: Request) -> Generator[Effect, Any, None]:
    """AsyncSender._withdraw_in_background: the caller gave up."""
    with contextlib.suppress(PrqError):
        yield from drive(node, cancel_flow(node.ctx, request.id, request.endpoint))


def cancel_op(node: SimNode, request_id: str, endpoint: str) -> Generator[Effect, Any, bool]:
    """AsyncSender.cancel."""
    flow = cancel_flow(
        node.ctx, request_id, node._sent_endpoint(request_id) or endpoint,
        on_cancelled=node._cancelled,
    )  # fmt: skip
    result: bool = yield from drive(node, flow)
    return result


def dequeue_op(
    node: SimNode, endpoint: str, max_items: int, current: list[str]
) -> Generator[Effect, Any, list[PendingRequest]]:
    """AsyncReceiver._take (`current`: the token of its take under way, as there)."""
    channel = node.keys.endpoint(endpoint).pulse_channel
    node.sim_pulses.ensure_subscribed(channel)
    try:
        flow = node._receive_flow(
            endpoint, channel, max_items, node.settings.dequeue_timeout_s, None, current
        )
        taken: list[PendingRequest] = yield from drive(node, flow)
    except BaseException:
        if current and not node._closed:
            node.giving_back.update(current)
            node.world.spawn(node, "unpark", unpark_op(node, list(current)))
        raise
    return taken


def unpark_op(node: SimNode, tokens: list[str]) -> Generator[Effect, Any, None]:
    """AsyncReceiver._give_back_in_background (`tokens` are in `node.giving_back` from when
    it is spawned)."""
    try:
        with contextlib.suppress(PrqError):
            yield from drive(node, node._unpark_flow(tokens), closing_ok=True)
    finally:
        node.giving_back.difference_update(tokens)


def answer_op(
    node: SimNode, pending: PendingRequest, run_s: float = 0.0
) -> Generator[Effect, Any, None]:
    """The handler's answer (an echo of its params) after it ran `run_s` (the node beats for
    the request meanwhile), as apply_response sends it."""
    try:
        if run_s > 0:
            running = SimSignal()  # (nothing fires it: the handler's time is its timeout)
            yield Wait(running, running.generation, run_s)
        yield from _answer(node, pending)
    finally:
        node.answering.discard(pending.id)


def _answer(node: SimNode, pending: PendingRequest) -> Generator[Effect, Any, None]:
    if not node._holds(pending.id):
        return
    body = node._encode_response(Response(id=pending.id, result=pending.request.params))
    flow = node._respond_flow(pending.id, body)
    if flow is None:
        return
    try:
        outcome: str = yield from drive(node, flow, closing_ok=True)
    except PrqError as exc:
        node._unanswered(pending.id, exc)
        return
    if outcome in ("ok", "replay"):
        # (when its answer was accepted: its caller is told within a bound from now, checks.py)
        node.world.answered_t.setdefault(pending.id, node.world.clock.monotonic())
    clean_up = node._after_respond(pending.id, outcome, body)
    if clean_up is not None:
        clean_up()


def close_op(node: SimNode) -> Generator[Effect, Any, None]:
    """AsyncDriver.aclose with a shutdown timeout of 0: give back everything held at once."""
    if node._closing or node._closed:
        return
    node._closing = True
    node._router.wake_all()
    with contextlib.suppress(PrqError):
        yield from drive(node, node._hand_back_flow(), closing_ok=True)
    node._closed = True
    node._router.wake_all()
    node.world.note(f"node {node.name} closed")
    node.world._replace(node)
