"""The blocking facade's shared structures under many threads at once.

A blocking node's callers, serve threads, pub/sub reader and watch thread share the pulse
router's tables, a receiver's spare take tokens and the presence tables. Each test runs the
operations that race from 16 threads for a bounded number of iterations, with the interpreter
switching threads as often as it can (`sys.setswitchinterval(1e-6)`), and fails on the first
exception any thread raised: a check-then-act or a loop over a dict another thread changes
ends a thread for good there (a serve worker, the pub/sub reader, the watch thread and with it
every heartbeat). Where a look and the act after it run without a thread switch between them
under the GIL, the structure is given a list whose looks let one fall there (`LookingList`).

Pure structures: no Redis is involved (the Queue is made and never started).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from prq.core.config import QueueSettings, RedisSettings
from prq.core.keys import KeySchema, encode_endpoint
from prq.facade.blocking_queue import Queue
from prq.protocol.presence import Presence
from prq.transport.pulse_router import PulseRouter
from prq.transport.signals import ThreadSignal

THREADS = 16
#: Iterations per thread: enough for each race to show within a second or two without its fix.
ITERATIONS = 3000
#: A URL no test connects to (the queue is never started).
NOWHERE = "redis://127.0.0.1:9/0"

pytestmark = pytest.mark.usefixtures("frequent_switches")  # (tests/unit/conftest.py)


def hammer(*workers: Callable[[int], None]) -> None:
    """Run each worker in THREADS // len(workers) threads, each for ITERATIONS iterations
    (given the iteration's number); raise the first exception any of them raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def run(work: Callable[[int], None]) -> None:
        start.wait()
        try:
            for n in range(ITERATIONS):
                if errors:
                    return
                work(n)
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=(workers[i % len(workers)],), daemon=True)
        for i in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a hammering thread hangs"
    if errors:
        raise errors[0]


def test_wake_all_while_takes_and_calls_come_and_go() -> None:
    # Given a router whose takes and response waits begin and end on many threads
    router = PulseRouter("prq:node:n1", ThreadSignal)
    channel = "prq:{e}:pulse"
    mine = threading.local()  # each thread's open takes and waits, the oldest first

    def take_and_call(n: int) -> None:
        held: collections.deque[contextlib.ExitStack] = mine.__dict__.setdefault(
            "held", collections.deque()
        )
        name = f"{threading.get_ident()}-{n}"
        opened = contextlib.ExitStack()
        opened.enter_context(router.watch_take(channel, name))
        opened.enter_context(router.watch_response(name))
        held.append(opened)
        if len(held) > 8 or n == ITERATIONS - 1:  # (a few open at once: longer tables)
            while held and (len(held) > 8 or n == ITERATIONS - 1):
                held.popleft().close()

    # When others fire every signal meanwhile (a reconnect, a data-loss declaration)
    def wake(n: int) -> None:
        with router.watch_take(channel, f"w-{threading.get_ident()}-{n}"):
            router.wake_all()

    # Then no thread fails, and nothing stays registered
    hammer(take_and_call, take_and_call, take_and_call, wake)
    assert router.watched_responses == 0
    assert all(not takes for takes in router._takes.values())


class LookingList(list[str]):
    """A list of spare tokens whose looks (a truth test, `in`) may let another thread run
    between the look and what is done after it. CPython with the GIL switches threads only
    at bytecodes that check for it, and none falls between a look at a plain list and a `pop`
    or `remove` right after it; where threads run at once (free-threaded CPython) nothing keeps
    them apart. The `sleep(0)` after each look lets a switch fall there, as such a build would."""

    def __bool__(self) -> bool:
        found = len(self) > 0
        time.sleep(0)
        return found

    def __contains__(self, item: object) -> bool:
        found = list.__contains__(self, item)
        time.sleep(0)
        return found


@pytest.fixture
def queue() -> Iterator[Queue]:
    made = Queue(RedisSettings(url=NOWHERE), settings=QueueSettings())
    try:
        yield made
    finally:
        made.close()


def test_spare_take_tokens_are_taken_by_many_serve_threads_at_once(queue: Queue) -> None:
    # Given the spare tokens of one endpoint, left by takes that failed (_take_failed), and
    # taken by the next takes of the serve threads (_take_token)
    endpoint = "poll://racing"
    queue._spare_tokens[endpoint] = LookingList()
    left: list[str] = []
    handed: list[str] = []

    def fail(n: int) -> None:
        token = f"spare-{threading.get_ident()}-{n}"
        left.append(token)
        queue._take_failed(endpoint, token)

    def take(n: int) -> None:
        handed.append(queue._take_token(endpoint))

    # When many serve threads do both at once
    hammer(fail, take, take, take)

    # Then none failed, and no spare token was handed to two takes, or lost
    spares = [token for token in handed if token.startswith("spare-")]
    assert len(spares) == len(set(spares))
    assert sorted(spares + queue._spare_tokens[endpoint]) == sorted(left)


def test_a_cut_short_take_gives_back_its_token_while_serve_threads_take_spares(
    queue: Queue,
) -> None:
    # Given takes cut short (their tokens spare and still taking), whose parks are withdrawn
    # (_unpark_flow, as closing does) while serve threads take spare tokens
    endpoint = "poll://racing"
    queue._spare_tokens[endpoint] = LookingList()

    def cut_short(n: int) -> None:
        token = f"{threading.get_ident()}-{n}"
        queue._taking[token] = endpoint
        queue._take_failed(endpoint, token)
        flow = queue._unpark_flow([token])
        next(flow)  # (up to its round trip, which is not made here)
        flow.close()

    def take(n: int) -> None:
        queue._take_token(endpoint)

    # When both happen at once, Then neither fails
    hammer(cut_short, take)


def test_presence_is_reported_while_callers_and_serve_threads_use_new_endpoints() -> None:
    # Given a node's presence, to which callers and serve threads add endpoints
    settings = QueueSettings(list_ttl_s=60)
    presence = Presence(KeySchema("prq"), settings, "n1")
    clock = [1000.0]

    def use(n: int) -> None:
        endpoint = f"poll://e-{n % 200}"  # (forgotten after the TTL, then added again)
        if n % 2:
            presence.took(endpoint, clock[0])
        else:
            presence.sent(endpoint, clock[0])

    # When the watch thread builds its reports meanwhile, forgetting what is old
    def report(n: int) -> None:
        clock[0] += 1.0  # (endpoints age past the list TTL as the reports go on)
        presence.calls(clock[0])

    # Then no report fails, and the last one still names what was used within the TTL
    hammer(use, use, use, report)
    presence.sent("poll://last", clock[0])
    assert encode_endpoint("poll://last") in presence.calls(clock[0])[0].args
