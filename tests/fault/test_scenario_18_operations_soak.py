"""Scenario 18 (issue 15): a randomized operations soak. The other scenarios test exotic faults
one at a time; this one is ordinary life, mixed: a steady call load over three endpoints from
both facades (call and send, at_most_once and at_least_once) while a seeded schedule
- restarts receivers: SIGKILL or SIGTERM, caught idle or busy (a SIGKILL victim is frozen at
  the chosen moment, so the test knows what it held: only those callers may hear "maybe
  executed" about a request no ledger shows started);
- lets an endpoint sit idle, still served for two list TTLs, or unserved until its enqueue
  counter expired (shrunk TTLs);
- sends ids again whose records expired;
- asks for answers over the receivers' max_body_bytes;
- cancels calls, by id from another node or by the caller's timeout;
- pauses Redis within the retry budget, resets every node's connections, and makes Redis lose
  data (FLUSHALL, or a restart empty), once or two and three times in a row at random
  intervals.

The schedule runs in rounds, each a seeded shuffle of every kind of step, until its time is up.
Then the checker demands no hung call, no at_most_once request run twice, no "maybe executed"
report for a request no ledger shows started (but those a killed receiver held, and those in
flight while Redis lost data), no DataLoss outside the losses the test caused, and no failed
load call that neither a killed receiver nor a lost Redis explains; no node may declare data
loss outside those losses either; and each step's own calls end as that step expects.

In CI it runs CI_MINUTES with CI_SEED. `--soak-minutes N` runs it N minutes with a random seed,
`--soak-seed S` replays a seed; the seed is printed first. A seed fixes the schedule (the steps,
their order and their draws), not the timing of the load around them.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from prq import Queue
from prq.core.keys import KeySchema
from prq.embedded import EmbeddedRedis
from tests.fault.checker import Call, CheckResult, check_nodes
from tests.fault.node_main import switch_path
from tests.fault.nodes import NodeFactory, NodeProcess
from tests.fault.proxy import FaultProxy
from tests.fault.redis_faults import client_for, flushall, paused, restart_empty
from tests.fault.scenarios import (
    CHECK_S,
    SLACK_S,
    data_loss_declared,
    events,
    figures,
    freeze_when,
    held_by,
    hold_fault,
    steady_for,
)
from tests.fault.timings import fault_redis_settings, fault_settings
from tests.redis_servers import wait_until

pytestmark = pytest.mark.fault

#: The schedule's length and seed in CI (the whole test takes about a minute more).
CI_MINUTES, CI_SEED = 2.0, 20261125
ENDPOINTS = ("poll://soak-a", "poll://soak-b", "poll://soak-c")
#: Shrunk TTLs (an answered request is kept 2 s, an unused enqueue counter 3 s); a take waits
#: at most 1 s, inside the list TTL as 30 s is inside a day in production; hand-offs are
#: confirmed within 1 s.
LIST_TTL_S, RESPONSE_TTL_S = 3.0, 2.0
TIMINGS = {
    "list_ttl_s": LIST_TTL_S,
    "response_ttl_s": RESPONSE_TTL_S,
    "dequeue_timeout_s": 1.0,
    "handoff_confirm_s": 1.0,
}
#: Receivers write answers of at most 4,096 bytes; an oversized answer asks for more.
RECEIVER_LIMITS = {"max_body_bytes": 4096, "inline_limit_bytes": 2048}
OVERSIZED = 6000
#: Receivers at any time (each serves every endpoint with SLOTS slots).
RECEIVERS, SLOTS = 3, 3
#: The load: name, facade, call style, delivery; CALLERS callers each, THINK_MS between calls,
#: each call keeping its handler SERVICE_MS.
LOAD = (
    ("load-a", "async", "call", "at_most_once"),
    ("load-b", "sync", "send", "at_most_once"),
    ("load-c", "async", "call", "at_least_once"),
)
CALLERS, THINK_MS, SERVICE_MS = 3, 100.0, 30.0
#: A call the checker judges hung: no outcome this long (plus its grace) after it began.
CALL_DEADLINE_S = 30.0
#: A step's own sender stops calling after CALL_DEADLINE_S and waits this long for its calls;
#: a step waits for it (bounded) before the next begins.
ONE_SHOT_DRAIN_S = 5.0
ONE_SHOT_S = CALL_DEADLINE_S + ONE_SHOT_DRAIN_S + 10.0
#: How long after a data-loss window a node's declaration of it still counts as due.
DECLARED_LATE_S = 5.0
#: What each step's own calls may end with.
EXPECTED = {
    "reuse": {"ok"},
    "oversized": {"RemoteError"},
    "cancel": {"CancelledBeforePickup", "CancelledAfterPickup", "CallTimeout", "ok"},
}


def soak_timeout_s(minutes: float | None) -> float:
    """The test's timeout (tests/fault/conftest.py): the schedule, its last step, setup and
    teardown."""
    return (CI_MINUTES if minutes is None else minutes) * 60.0 + 150.0


@pytest.fixture
def soak_plan(request: pytest.FixtureRequest) -> tuple[float, int]:
    """(minutes, seed) of this run (see the module docstring)."""
    minutes = request.config.getoption("--soak-minutes")
    seed = request.config.getoption("--soak-seed")
    if seed is None:
        seed = CI_SEED if minutes is None else random.SystemRandom().randrange(2**32)
    return (CI_MINUTES if minutes is None else minutes), seed


@dataclass
class Soak:
    """The running soak: its nodes and what its steps did (for the checker and the report)."""

    nodes: NodeFactory
    server: EmbeddedRedis
    prefix: str
    switches: Path
    make_proxy: Callable[..., FaultProxy]
    canceller: Queue
    rng: random.Random
    lifetime_s: float
    client: redis.Redis = field(init=False)
    receivers: list[NodeProcess] = field(default_factory=list)
    proxies: list[FaultProxy] = field(default_factory=list)
    #: Each receiver's own proxy, by name.
    proxy_of: dict[str, FaultProxy] = field(default_factory=dict)
    #: Requests killed receivers held (their callers may hear "maybe executed").
    picked_up: set[str] = field(default_factory=set)
    #: When Redis lost data: from the fault until every node noticed (monotonic), and the
    #: same on the wall clock (node logs are stamped with it).
    data_loss_windows: list[tuple[float, float]] = field(default_factory=list)
    data_loss_wall: list[tuple[float, float]] = field(default_factory=list)
    #: One-shot senders by the step that started them.
    steps_nodes: dict[str, list[NodeProcess]] = field(default_factory=dict)
    done: Counter[str] = field(default_factory=Counter)
    numbers: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        self.client = client_for(self.server)

    # -- nodes --------------------------------------------------------------------------------

    def link(self) -> str:
        """A proxy of its own for a long-lived node (so its connections can be reset)."""
        self.proxies.append(self.make_proxy(parse_resp=False))
        return self.proxies[-1].url

    def start_receiver(self, slot: int) -> None:
        node = self.nodes.receiver(
            f"r{next(self.numbers)}",
            facade=self.rng.choice(("async", "sync")),
            endpoint=ENDPOINTS[0],
            extra_endpoints=list(ENDPOINTS[1:]),
            switch_dir=str(self.switches),
            concurrency=SLOTS,
            handler="sleep",
            handler_ms=SERVICE_MS,
            queue_settings={**TIMINGS, **RECEIVER_LIMITS},
            redis_url=self.link(),
            max_lifetime_s=self.lifetime_s,
        )
        self.proxy_of[node.name] = self.proxies[-1]
        if slot < len(self.receivers):
            self.receivers[slot] = node
        else:
            self.receivers.append(node)

    def start_load(self) -> list[NodeProcess]:
        return [
            self.nodes.sender(
                name,
                facade=facade,
                call_style=style,
                delivery=delivery,
                endpoint=ENDPOINTS[0],
                extra_endpoints=list(ENDPOINTS[1:]),
                switch_dir=str(self.switches),
                concurrency=CALLERS,
                think_ms=THINK_MS,
                params={"sleep_ms": SERVICE_MS},
                call_deadline_s=CALL_DEADLINE_S,
                queue_settings=TIMINGS,
                redis_url=self.link(),
                max_lifetime_s=self.lifetime_s,
            )
            for name, facade, style, delivery in LOAD
        ]

    def one_shot(self, step: str, endpoint: str, **config: Any) -> NodeProcess:
        """A sender of a step's own calls, straight to Redis; started (its calls begin). Calls
        still open after their deadline are left to the checker (it judges them hung)."""
        config.setdefault("facade", self.rng.choice(("async", "sync")))
        node = self.nodes.sender(
            f"{step}-{next(self.numbers)}",
            endpoint=endpoint,
            call_deadline_s=CALL_DEADLINE_S,
            duration_s=CALL_DEADLINE_S,
            drain_timeout_s=ONE_SHOT_DRAIN_S,
            queue_settings=TIMINGS,
            **config,
        )
        self.steps_nodes.setdefault(step, []).append(node)
        return node

    # -- steps --------------------------------------------------------------------------------

    def restart(self, how: str, busy: bool) -> str:
        """Stop a receiver (SIGKILL or SIGTERM) caught idle or busy; start another."""
        slot = self.rng.randrange(RECEIVERS)
        victim = self.receivers[slot]
        if busy:
            # (long calls, so that a SIGTERM has work to finish)
            self.one_shot(
                "long", self.rng.choice(ENDPOINTS), count=SLOTS, concurrency=SLOTS,
                params={"sleep_ms": 1500},
            )  # fmt: skip
        if how == "SIGKILL":
            held = freeze_when(victim, self.client, self.prefix, ENDPOINTS, busy=busy)
            self.picked_up |= held
            victim.kill()
            # (a take it sent just before it froze may still have been in its proxy then, and
            # reached Redis after the look: once the proxy has closed its links, all it
            # forwarded has arrived, and what the victim took by then counts too)
            proxy = self.proxy_of[victim.name]
            wait_until(lambda: proxy.open_connections == 0, 10, 0.01, f"{victim.name} unlinked")
            self.client.ping()
            self.picked_up |= held_by(self.client, self.prefix, victim.name, ENDPOINTS)
        else:
            held = wait_until(
                lambda: self._caught(victim, busy), 20, 0.005, f"{victim.name} busy={busy}"
            )[0]
            assert victim.stop() == 0, f"{victim.name} did not stop gracefully"
        self.start_receiver(slot)
        return f"{how} {victim.name} {'busy' if busy else 'idle'} holding {len(held)}"

    def _caught(self, receiver: NodeProcess, busy: bool) -> tuple[set[str]] | None:
        """(what `receiver` holds,) if it is busy (holds something) as wanted, else None."""
        held = held_by(self.client, self.prefix, receiver.name, ENDPOINTS)
        return (held,) if bool(held) == busy else None

    def idle(self, served: bool) -> str:
        """Nobody calls an endpoint for two list TTLs (served) or until its counter expired and
        three data-loss checks passed (unserved); then it is used again."""
        endpoint = self.rng.choice(ENDPOINTS)
        keys = KeySchema(self.prefix).endpoint(endpoint)
        calls_off = switch_path(self.switches, "calls-off", endpoint)
        serve_off = switch_path(self.switches, "serve-off", endpoint)
        calls_off.touch()
        started = time.monotonic()
        if served:
            hold_fault(2 * LIST_TTL_S)
        else:
            # (what its calls left queued or in flight is served first)
            wait_until(lambda: not self.client.exists(keys.levels, keys.running), 30, 0.02, "quiet")
            serve_off.touch()
            wait_until(
                lambda: not self.client.exists(keys.sequence), 4 * LIST_TTL_S + 10, 0.02,
                f"{endpoint} counter expired",
            )  # fmt: skip
            hold_fault(3 * CHECK_S)
        serve_off.unlink(missing_ok=True)
        calls_off.unlink()
        return f"{endpoint} idle {time.monotonic() - started:.1f} s, {'' if served else 'un'}served"

    def reuse(self) -> str:
        """Send again, to their endpoint, ids of load calls whose records expired."""
        load = self.rng.choice([n for n in self.nodes.senders if n.name.startswith("load-")])
        started = {r["id"]: r for r in events(load, "start")}
        old = time.monotonic() - RESPONSE_TTL_S - 1.0
        answered = [
            started[r["id"]]
            for r in events(load, "end")
            if r["outcome"] == "ok" and r["t_mono"] < old and r["id"] in started
        ]
        endpoint = self.rng.choice(ENDPOINTS)
        keys = KeySchema(self.prefix).endpoint(endpoint)
        recent = [r["id"] for r in answered if r["endpoint"] == endpoint][-20:]
        ids = [
            request_id
            for request_id in self.rng.sample(recent, min(3, len(recent)))
            if not self.client.exists(keys.request(request_id))
        ]
        if not ids:
            return f"no expired ids of {load.name} on {endpoint} yet"
        delivery = load.config.delivery
        node = self.one_shot(
            "reuse", endpoint, request_ids=ids, count=len(ids), concurrency=len(ids),
            delivery=delivery,
        )  # fmt: skip
        node.wait(ONE_SHOT_S)
        return f"{len(ids)} {delivery} ids of {load.name} again on {endpoint}"

    def oversized(self) -> str:
        endpoint = self.rng.choice(ENDPOINTS)
        node = self.one_shot(
            "oversized", endpoint, count=2, concurrency=2,
            call_style=self.rng.choice(("call", "send")), params={"answer_pad": OVERSIZED},
        )  # fmt: skip
        node.wait(ONE_SHOT_S)
        return f"2 answers of {OVERSIZED} bytes asked on {endpoint}"

    def cancel(self) -> str:
        """Long calls cancelled by id from another node, or by their caller's timeout."""
        endpoint = self.rng.choice(ENDPOINTS)
        by_id = self.rng.random() < 0.5
        ids = [uuid.uuid4().hex for _ in range(3)]
        node = self.one_shot(
            "cancel", endpoint, request_ids=ids, count=len(ids), concurrency=len(ids),
            params={"sleep_ms": 2000}, call_timeout_s=None if by_id else 1.0,
        )  # fmt: skip
        if by_id:
            steady_for(self.rng.uniform(0.0, 1.5))  # (when in the calls' lives the cancels land)
            for request_id in ids:
                self.canceller.cancel(request_id)
        node.wait(ONE_SHOT_S)
        return f"3 calls on {endpoint} cancelled {'by id' if by_id else 'by their timeout'}"

    def pause(self) -> str:
        seconds = self.rng.uniform(1.0, 3.0)
        with paused(self.server):
            hold_fault(seconds)
        return f"Redis paused {seconds:.1f} s"

    def resets(self) -> str:
        for _ in range(3):
            for proxy in self.proxies:
                proxy.reset_connections()
            steady_for(self.rng.uniform(0.3, 1.0))
        return "every link reset 3 times"

    def lose_data(self, times: int = 1) -> str:
        """Redis loses its data `times` times in a row (a FLUSHALL or a restart empty each,
        drawn), at random intervals of up to 2.5 data-loss checks: two restarts close together
        (a crash loop, maintenance after a deploy) are ordinary life without persistence."""
        losses = []
        started, started_wall = time.monotonic(), time.time()
        for n in range(times):
            if n:
                hold_fault(self.rng.uniform(0.1, 2.5) * CHECK_S)
            how = self.rng.choice(("flushall", "restart_empty"))
            if how == "flushall":
                flushall(self.server)
            else:
                restart_empty(self.server)
                self.client.close()
                self.client = client_for(self.server)
            losses.append(how)
        # (every node notices within a data-loss check and 1 s)
        hold_fault(CHECK_S + SLACK_S)
        self.data_loss_windows.append((started, time.monotonic()))
        self.data_loss_wall.append((started_wall, time.time()))
        return ", then ".join(losses)

    def steps(self) -> list[tuple[str, Callable[[], str]]]:
        """One round: every kind of step once (its order shuffled by the caller)."""
        return [
            ("kill-idle", lambda: self.restart("SIGKILL", busy=False)),
            ("kill-busy", lambda: self.restart("SIGKILL", busy=True)),
            ("term-idle", lambda: self.restart("SIGTERM", busy=False)),
            ("term-busy", lambda: self.restart("SIGTERM", busy=True)),
            ("idle-served", lambda: self.idle(served=True)),
            ("idle-unserved", lambda: self.idle(served=False)),
            ("reuse", self.reuse),
            ("oversized", self.oversized),
            ("cancel", self.cancel),
            ("pause", self.pause),
            ("resets", self.resets),
            ("data-loss", self.lose_data),
            ("data-losses", lambda: self.lose_data(self.rng.randint(2, 3))),
        ]

    def run(self, seconds: float) -> None:
        """Rounds of shuffled steps, with 0.5-2 s of plain load between two, until `seconds`
        have passed (the step under way finishes). The order comes from the soak's seed, and
        each step draws from a generator of its own seeded from it, so that what a step finds
        (which ids have expired) changes none of the later steps."""
        schedule = self.rng
        began = time.monotonic()
        while time.monotonic() - began < seconds:
            round_ = self.steps()
            schedule.shuffle(round_)
            for name, step in round_:
                if time.monotonic() - began >= seconds:
                    break
                self.rng = random.Random(schedule.getrandbits(64))
                at = time.monotonic() - began
                print(f"[S18] {at:6.1f} s {name}: {step()}", flush=True)
                self.done[name] += 1
                steady_for(schedule.uniform(0.5, 2.0))


def _undue_declarations(soak: Soak) -> list[str]:
    """Data-loss declarations of nodes (their log lines) outside every data-loss window (with
    DECLARED_LATE_S of tolerance: a check delayed by a busy machine)."""
    undue = []
    for node in soak.nodes.nodes:
        for line in data_loss_declared(node):
            at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if not any(a - 1.0 <= at <= b + DECLARED_LATE_S for a, b in soak.data_loss_wall):
                undue.append(line)
    return undue


def _unexplained(result: CheckResult, soak: Soak) -> list[Call]:
    """Failed calls of the load (and the long ones) that neither a killed receiver nor a loss
    of Redis explains."""
    return [
        call
        for call in result.calls
        if call.node.startswith(("load-", "long-"))
        and call.finished
        and not call.ok
        and call.id not in soak.picked_up
        and not any(call.in_flight_during(*window) for window in soak.data_loss_windows)
    ]


@contextlib.contextmanager
def _canceller(url: str, prefix: str) -> Iterator[Queue]:
    queue = Queue(
        fault_redis_settings(url), prefix=prefix, settings=fault_settings(**TIMINGS),
        node_id="canceller",
    )  # fmt: skip
    queue.start()
    try:
        yield queue
    finally:
        queue.close()


def test_operations_soak(
    nodes: NodeFactory,
    make_proxy: Callable[..., FaultProxy],
    fault_redis: EmbeddedRedis,
    fault_prefix: str,
    fault_dir: Path,
    soak_plan: tuple[float, int],
) -> None:
    minutes, seed = soak_plan
    print(f"[S18] seed={seed} minutes={minutes:g} (replay: --soak-seed {seed})", flush=True)
    switches = fault_dir / "switches"
    switches.mkdir()
    with _canceller(fault_redis.url, fault_prefix) as canceller:
        soak = Soak(
            nodes, fault_redis, fault_prefix, switches, make_proxy, canceller,
            random.Random(seed), lifetime_s=minutes * 60.0 + 120.0,
        )  # fmt: skip
        try:
            # Given three receivers serving three endpoints, and a steady load on all three
            for slot in range(RECEIVERS):
                soak.start_receiver(slot)
            load = soak.start_load()
            wait_until(lambda: all(len(events(n, "end")) >= 10 for n in load), 30, 0.05, "load")

            # When the schedule runs its steps
            soak.run(minutes * 60.0)

            # And the load stops, then the receivers
            codes = {node.name: node.stop() for node in load}
            codes |= {node.name: node.stop() for node in soak.receivers}
            codes |= {node.name: node.wait(ONE_SHOT_S) for node in nodes.senders}
            result = check_nodes(
                nodes.nodes,
                name=f"S18 seed={seed}",
                redis_client=soak.client,
                prefix=fault_prefix,
                picked_up=soak.picked_up,
                data_loss_windows=soak.data_loss_windows,
            )
        finally:
            soak.client.close()

    # Then nothing hung, no at_most_once request ran twice, no "maybe executed" without a start
    # or an excuse, no DataLoss but where Redis lost data, and every failed load call has a cause
    print(result.report())
    unexplained = _unexplained(result, soak)
    undue = _undue_declarations(soak)
    by_step = {
        step: Counter(c.outcome or "unfinished" for c in result.calls if c.node in names)
        for step, names in (
            (step, {n.name for n in step_nodes}) for step, step_nodes in soak.steps_nodes.items()
        )
    }
    figures(
        "S18",
        seed=seed,
        minutes=minutes,
        steps=dict(soak.done),
        picked_up=len(soak.picked_up),
        data_loss_windows=len(soak.data_loss_windows),
        reruns=len(result.reruns),
        unexplained=[f"{c.outcome}: {c.message[:60]}" for c in unexplained[:5]],
        undue_declarations=undue[:5],
        by_step={step: dict(outcomes) for step, outcomes in by_step.items()},
        exit_codes={name: code for name, code in codes.items() if code != 0},
    )
    result.assert_clean(min_calls=500, max_false_maybe_executed=0, max_false_data_loss=0)
    assert unexplained == [], f"seed {seed}: load calls failed without a cause"
    assert undue == [], f"seed {seed}: data loss declared where Redis lost nothing"
    for step, allowed in EXPECTED.items():
        assert set(by_step.get(step, {})) <= allowed, f"seed {seed}: {step}: {by_step[step]}"
    too_large = [
        c for c in result.calls if c.node.startswith("oversized-") and not c.message.startswith(
            "ResponseTooLarge: "
        )
    ]  # fmt: skip
    assert too_large == [], f"seed {seed}: oversized answers not told as such"
    assert codes == dict.fromkeys(codes, 0), f"seed {seed}: nodes did not stop cleanly"
