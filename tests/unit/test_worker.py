"""build_response: handler outcomes become responses; _Pace: when a serve loop may take ahead;
_AsyncAnswers: which answers of an asyncio serve loop go out together; _TakeTurns: how many
threads a blocking serve loop wakes for a take's requests."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any, cast

import pytest

from prq.errors import PrqError
from prq.redis_io import MAX_ROUND_TRIPS_IN_FLIGHT
from prq.worker import (
    PACE_WEIGHT,
    SHARE_S,
    TAKE_AHEAD_BELOW_S,
    _AsyncAnswers,
    _Pace,
    _TakeTurns,
    build_response,
)

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


def leave(answers: _AsyncAnswers, writes: Writes, request_id: str) -> None:
    writes._serving.add(request_id)  # (as a serve loop's task does before its handler runs)
    answers.leave(request_id, b"1")


async def link_busy(answers: _AsyncAnswers, writes: Writes) -> None:
    """Leave w0, w1, ... until as many writes are in flight as the link carries at once (each
    once the write before it began: answers left together go in one write)."""
    for i in range(MAX_ROUND_TRIPS_IN_FLIGHT):
        leave(answers, writes, f"w{i}")
        await writes.started(i + 1)


async def test_a_lone_answer_is_written_at_once_and_alone_by_its_own_task() -> None:
    writes = Writes()
    answers = answers_to(writes)
    writes._serving.add("a")
    task = asyncio.create_task(answers.answer("a", b"1"))
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
    await link_busy(answers, writes)
    # When ten more answers are left meanwhile
    for i in range(10):
        leave(answers, writes, f"a{i}")
    for _ in range(3):
        await asyncio.sleep(0)
    assert len(writes.batches) == MAX_ROUND_TRIPS_IN_FLIGHT  # they wait: no write of their own
    assert answers.unwritten == MAX_ROUND_TRIPS_IN_FLIGHT + 10
    # (and a handler's task answering now returns at once, leaving its answer too)
    writes._serving.add("a10")
    await asyncio.wait_for(answers.answer("a10", b"1"), WAIT_S)
    # Then, once a write ends, they go out together in one write, held until it ends
    writes.finish(0)
    await writes.started(MAX_ROUND_TRIPS_IN_FLIGHT + 1)
    assert writes.batches[-1] == [f"a{i}" for i in range(11)]
    assert {f"a{i}" for i in range(11)} <= writes._serving
    for write in range(1, len(writes.gates)):
        writes.finish(write)
    await asyncio.wait_for(answers.flush(), WAIT_S)
    assert len(writes.batches) == MAX_ROUND_TRIPS_IN_FLIGHT + 1
    assert answers.unwritten == 0 and writes._serving == set()


async def test_answers_left_behind_a_failed_write_are_written_by_another_writer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a write in flight for every round trip the link carries, and answers waiting
    writes = Writes()
    answers = answers_to(writes)
    await link_busy(answers, writes)
    for i in range(3):
        leave(answers, writes, f"a{i}")
    # When every write in flight fails
    for write in range(MAX_ROUND_TRIPS_IN_FLIGHT):
        writes.fail_next = RuntimeError("writer gone")
        writes.finish(write)
    # Then the waiting answers are written all the same, by a writer started in its place, and
    # the failure is logged
    await writes.started(MAX_ROUND_TRIPS_IN_FLIGHT + 1)
    assert writes.batches[-1] == ["a0", "a1", "a2"]
    writes.finish(len(writes.gates) - 1)
    await asyncio.wait_for(answers.flush(), WAIT_S)
    assert answers.unwritten == 0 and writes._serving == set()
    assert "answer writer failed" in caplog.text


async def test_closing_writes_what_a_cancelled_writer_left() -> None:
    # Given answers waiting behind writes in flight
    writes = Writes()
    answers = answers_to(writes)
    await link_busy(answers, writes)
    leave(answers, writes, "late")
    # When every writer is cancelled (the loop going away under them)
    for writer in list(answers.writers):
        writer.cancel()
    for _ in range(3):
        await asyncio.sleep(0)
    assert not answers.writers and answers.queued == [("late", b"1")]
    # Then flushing (what a serve loop does as it ends) writes what they left
    flushing = asyncio.ensure_future(answers.flush())
    await writes.started(MAX_ROUND_TRIPS_IN_FLIGHT + 1)
    assert writes.batches[-1] == ["late"]
    writes.finish(len(writes.gates) - 1)
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
