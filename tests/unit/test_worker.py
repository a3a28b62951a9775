"""build_response: handler outcomes become responses; _Pace: when a serve loop may take ahead;
_AsyncAnswers: which answers of an asyncio serve loop go out together; _TakeTurns: how many
threads a blocking serve loop wakes for a take's requests."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, cast

import pytest

from prq.core.errors import PrqError
from prq.serve.async_answers import _AsyncAnswers
from prq.serve.handled import build_response
from prq.serve.pace import PACE_WEIGHT, TAKE_AHEAD_BELOW_S, _Pace
from prq.serve.take_turns import SHARE_S, TAKE_AHEAD_LEFT_S, _TakeTurns
from prq.transport.batches import MAX_ROUND_TRIPS_IN_FLIGHT

#: Bound of every wait in the _AsyncAnswers tests.
WAIT_S = 5.0


class Flaky(Exception):
    retryable = True


def test_result_becomes_response() -> None:
    assert build_response("a", {"x": 1}).result == {"x": 1}


def test_exception_becomes_error() -> None:
    response = build_response("a", exc=Flaky("try later"))
    assert response.error is not None
    assert (response.error.type, response.error.message) == ("Flaky", "try later")
    assert response.error.retryable


def test_non_json_result_becomes_serialization_error() -> None:
    response = build_response("a", object())
    assert response.error is not None
    assert response.error.type == "SerializationError"


def test_a_serve_loop_takes_ahead_only_once_its_handlers_have_proven_quick() -> None:
    pace = _Pace()
    assert not pace.quick  # nothing ran yet: no taking ahead
    pace.ran(TAKE_AHEAD_BELOW_S / 10)
    assert pace.quick


def test_one_slow_run_among_quick_ones_moves_the_pace_by_its_weight() -> None:
    pace = _Pace()
    for _ in range(50):
        pace.ran(0.001)
    pace.ran(0.5)
    assert pace.mean_s is not None
    assert abs(pace.mean_s - (0.001 + PACE_WEIGHT * 0.499)) < 1e-9
    assert not pace.quick  # a handler that slow stops taking ahead at once
    for _ in range(100):
        pace.ran(0.001)
    assert pace.quick  # and quick runs bring it back


class Writes:
    """Stands in for the queue behind _AsyncAnswers: records each write's answers, and holds
    every write until the test lets it end (`finish`)."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.gates: list[asyncio.Event] = []
        self.fail_next: BaseException | None = None
        self._serving: set[str] = set()

    async def _write_answers(self, answers: Sequence[tuple[str, bytes]]) -> dict[str, PrqError]:
        self.batches.append([request_id for request_id, _ in answers])
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        return {}

    def finish(self, write: int) -> None:
        self.gates[write].set()

    async def started(self, writes: int) -> None:
        async with asyncio.timeout(WAIT_S):
            while len(self.batches) < writes:
                await asyncio.sleep(0)


def answers_to(writes: Writes) -> _AsyncAnswers:
    return _AsyncAnswers(cast(Any, writes))


def answer(answers: _AsyncAnswers, writes: Writes, request_id: str) -> asyncio.Task[None]:
    """A serve loop's task answering `request_id` (serving since before its handler ran)."""
    writes._serving.add(request_id)
    return asyncio.create_task(answers.answer(request_id, b"1"))


async def link_busy(answers: _AsyncAnswers, writes: Writes) -> list[asyncio.Task[None]]:
    """Answer w0, w1, ... until as many writes are in flight as the link carries at once (each
    once the write before it began: answers left together go in one write); their tasks."""
    tasks = []
    for i in range(MAX_ROUND_TRIPS_IN_FLIGHT):
        tasks.append(answer(answers, writes, f"w{i}"))
        await writes.started(i + 1)
    return tasks


async def test_a_lone_answer_is_written_at_once_and_alone_by_its_own_task() -> None:
    writes = Writes()
    answers = answers_to(writes)
    task = answer(answers, writes, "a")
    await writes.started(1)
    assert writes.batches == [["a"]]
    assert answers.writers == {task}  # (no writer task of its own: no turn of the loop lost)
    assert answers.unwritten == 1 and writes._serving == {"a"}  # held until written
    writes.finish(0)
    await asyncio.wait_for(task, WAIT_S)
    assert answers.unwritten == 0 and writes._serving == set() and not answers.writers


async def test_answers_left_while_the_link_is_busy_go_out_together_in_the_next_write() -> None:
    # Given as many writes in flight as the link carries at once
    writes = Writes()
    answers = answers_to(writes)
    first = await link_busy(answers, writes)
    # When ten more answers come meanwhile, Then each task returns at once, leaving its answer
    later = [answer(answers, writes, f"a{i}") for i in range(10)]
    await asyncio.wait_for(asyncio.gather(*later), WAIT_S)
    assert len(writes.batches) == MAX_ROUND_TRIPS_IN_FLIGHT  # no write of their own
    assert answers.unwritten == MAX_ROUND_TRIPS_IN_FLIGHT + 10
    # And once a write ends, they go out together in the next write, held until it ends
    writes.finish(0)
    await writes.started(MAX_ROUND_TRIPS_IN_FLIGHT + 1)
    assert writes.batches[-1] == [f"a{i}" for i in range(10)]
    assert {f"a{i}" for i in range(10)} <= writes._serving
    for write in range(1, len(writes.gates)):
        writes.finish(write)
    await asyncio.wait_for(asyncio.gather(*first), WAIT_S)
    await asyncio.wait_for(answers.flush(), WAIT_S)
    assert len(writes.batches) == MAX_ROUND_TRIPS_IN_FLIGHT + 1
    assert answers.unwritten == 0 and writes._serving == set()


async def test_answers_left_behind_a_failed_write_are_written_by_another_writer() -> None:
    # Given a write in flight for every round trip the link carries, and answers waiting
    writes = Writes()
    answers = answers_to(writes)
    first = await link_busy(answers, writes)
    waiting = [answer(answers, writes, f"a{i}") for i in range(3)]
    await asyncio.wait_for(asyncio.gather(*waiting), WAIT_S)
    # When every write in flight fails (their tasks see the error)
    for write in range(MAX_ROUND_TRIPS_IN_FLIGHT):
        writes.fail_next = RuntimeError("writer gone")
        writes.finish(write)
        with pytest.raises(RuntimeError):
            await asyncio.wait_for(first[write], WAIT_S)
    # Then the waiting answers are written all the same, by a writer started in their place
    await writes.started(MAX_ROUND_TRIPS_IN_FLIGHT + 1)
    assert writes.batches[-1] == ["a0", "a1", "a2"]
    writes.finish(len(writes.gates) - 1)
    await asyncio.wait_for(answers.flush(), WAIT_S)
    assert answers.unwritten == 0 and writes._serving == set()


async def test_a_writer_that_fails_on_its_own_is_logged_and_replaced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a writer task of the queue's own (started for what a failed write left)
    writes = Writes()
    answers = answers_to(writes)
    writes._serving.add("a")
    answers.queued.append(("a", b"1"))
    answers.ensure_writing()
    await writes.started(1)
    writes._serving.add("b")
    answers.queued.append(("b", b"1"))
    # When its write fails, Then the failure is logged and another writer writes what is left
    writes.fail_next = RuntimeError("writer gone")
    writes.finish(0)
    await writes.started(2)
    assert writes.batches[-1] == ["b"]
    assert "answer writer failed" in caplog.text
    writes.finish(1)
    await asyncio.wait_for(answers.flush(), WAIT_S)
    assert answers.unwritten == 0 and writes._serving == set()


async def test_closing_writes_what_a_cancelled_writer_left() -> None:
    # Given a writer task of the queue's own, and an answer waiting behind it
    writes = Writes()
    answers = answers_to(writes)
    answers.queued.append(("a", b"1"))
    answers.ensure_writing()
    await writes.started(1)
    answers.queued.append(("late", b"1"))
    # When the writer is cancelled (the loop going away under it)
    for writer in list(answers.writers):
        writer.cancel()
    for _ in range(3):
        await asyncio.sleep(0)
    assert not answers.writers and answers.queued == [("late", b"1")]
    # Then flushing (what a serve loop does as it ends) writes what it left
    flushing = asyncio.ensure_future(answers.flush())
    await writes.started(2)
    assert writes.batches[-1] == ["late"]
    writes.finish(1)
    await asyncio.wait_for(flushing, WAIT_S)
    assert answers.unwritten == 0


def test_a_blocking_serve_loop_wakes_threads_for_a_takes_requests_by_their_pace() -> None:
    turns = _TakeTurns(cast(Any, None), "poll://e", lambda: False, threading.Event())
    # the pace not known yet: a thread for each request left over
    assert [turns.helpers(n) for n in (0, 1, 49)] == [0, 1, 49]
    # quick handlers: one thread for what the taker leaves, whatever its number
    turns.pace.ran(SHARE_S / 1000)
    assert [turns.helpers(n) for n in (0, 1, 49)] == [0, 1, 1]
    # one more thread per SHARE_S of expected handler time, at most one per request
    turns.pace = _Pace()
    turns.pace.ran(SHARE_S / 2)
    assert [turns.helpers(n) for n in (1, 2, 3, 49)] == [1, 1, 2, 25]
    turns.pace = _Pace()
    turns.pace.ran(1.0)
    assert turns.helpers(49) == 49


class TakesFrom:
    """A stand-in for a Queue's take (`_take`): records each take's size and timeout, and
    hands out the next of the batches it was given."""

    def __init__(self, *batches: int) -> None:
        self.batches = list(batches)
        self.takes: list[tuple[int, float]] = []
        self.settings = SimpleNamespace(dequeue_timeout_s=5.0)
        self._serving: set[str] = set()
        self.made = 0

    def _take(self, endpoint: str, want: int, timeout_s: float, stopped: Any) -> list[Any]:
        self.takes.append((want, timeout_s))
        count = min(want, self.batches.pop(0) if self.batches else 0)
        self.made += count
        return [SimpleNamespace(id=f"r{self.made - count + i}") for i in range(count)]


def quick_turns(queue: TakesFrom, concurrency: int, mean_s: float, stopped: bool = False) -> Any:
    turns = _TakeTurns(
        cast(Any, queue), "poll://e", lambda: stopped, threading.Event(), concurrency
    )
    turns.pace.ran(mean_s)
    return turns


def test_a_blocking_serve_loop_takes_ahead_while_its_handlers_are_quick() -> None:
    # Given 8 workers whose handlers are quick
    queue = TakesFrom(5, 2)
    turns = quick_turns(queue, 8, TAKE_AHEAD_LEFT_S / 100)
    # When the first worker takes: up to twice its concurrency, parked as long as configured
    first, _ = turns.next_request()
    assert queue.takes == [(16, 5.0)] and first.id == "r0"
    # And it comes back with 4 requests left in the backlog (little work)
    second, _ = turns.next_request(ran=True)
    # Then it takes the next batch first, without parking, room left for what is held; and
    # runs the oldest request waiting
    assert queue.takes[1] == (16 - 4, 0.0)
    assert second.id == "r1"
    assert [p.id for p in turns.backlog] == ["r2", "r3", "r4", "r5", "r6"]
    assert turns.running == 1
    # And while a take is on its way, the others run what is left instead of taking
    turns.taking = True
    third, _ = turns.next_request()
    assert third.id == "r2" and len(queue.takes) == 2


@pytest.mark.parametrize(
    ("concurrency", "mean_s", "left", "stopped"),
    [
        (8, TAKE_AHEAD_BELOW_S * 2, 2, False),  # slow handlers: no taking ahead
        (8, TAKE_AHEAD_LEFT_S / 10, 20, False),  # more work left than a take's round trip
        (1, TAKE_AHEAD_LEFT_S / 100, 2, False),  # no other worker runs what is left
        (8, TAKE_AHEAD_LEFT_S / 100, 2, True),  # stopping: what is left is run, nothing taken
    ],
)
def test_a_blocking_serve_loop_runs_what_is_left_before_taking_when(
    concurrency: int, mean_s: float, left: int, stopped: bool
) -> None:
    queue = TakesFrom()
    turns = quick_turns(queue, concurrency, mean_s, stopped)
    turns.backlog.extend(SimpleNamespace(id=f"q{i}") for i in range(left))
    pending, going = turns.next_request()
    assert pending.id == "q0" and going
    assert queue.takes == []
