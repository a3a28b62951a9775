"""Schedules a test names step by step (World.play), for an interleaving the random schedules
reach too rarely to keep in CI: each is one seed of the simulation, played by hand."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from functools import partial

import pytest
import redis

from prq.core.errors import DataLoss, QueueUnavailable
from prq.protocol.effects import Exec
from prq.protocol.scripts.loading import ENQUEUE, ENQUEUE_MANY, TAKE
from tests.sim.clock import SimClock, seeded_randomness, virtual_time
from tests.sim.world import Knobs, Task, World

pytestmark = pytest.mark.integration


@pytest.fixture
def world(sim_redis: redis.Redis) -> Iterator[World]:
    sim_redis.flushall()
    sim_redis.script_flush()
    clock = SimClock()
    knobs = Knobs(deliveries=("at_most_once",), pickup_windows=(30.0,), senders=1, receivers=1)
    with seeded_randomness(1), virtual_time(clock):
        world = World(sim_redis, 1, knobs=knobs, clock=clock)
        try:
            yield world
        finally:
            world.close()


def _sending(task: Task, sha: str) -> bool:
    effect = task.effect
    return (
        task.phase == "sent"
        and isinstance(effect, Exec)
        and any(c.script is not None and c.script.sha == sha for c in effect.calls)
    )


def _sending_its_enqueue(task: Task) -> bool:
    return _sending(task, ENQUEUE.sha)


def test_a_message_whose_link_gave_up_after_it_was_sent_may_have_run(world: World) -> None:
    sender, receiver = world.nodes
    # Given a one-way message whose enqueue reached Redis, and whose link then gave up
    world._start_notify(sender)
    notify = world.tasks[-1]
    request_id = list(world.calls)[-1]
    world.play(notify, lambda: _sending(notify, ENQUEUE_MANY.sha))
    world.run_task_calls(notify, notify.effect)  # type: ignore[arg-type]
    world._advance(notify, partial(notify.gen.throw, QueueUnavailable("the link gave up")))
    # Then its sender is told it may have been queued and run
    outcome = world.calls[request_id].outcome
    assert outcome is not None and isinstance(outcome.error, QueueUnavailable)
    assert outcome.error.maybe_executed
    assert request_id in str(outcome.error)
    # as it is: a receiver takes it and its handler gets it
    world._start_dequeue(receiver)
    world.play(world.tasks[-1], lambda: request_id in world.runs)
    assert world.runs[request_id] == ["r0"]


def test_a_take_whose_give_back_fails_is_collected_by_the_next_take_of_its_node(
    world: World,
) -> None:
    sender, receiver = world.nodes
    # Given a queued call
    world._start_call(sender)
    call = world.tasks[-1]
    request_id = list(world.calls)[-1]
    world.play(call, lambda: call.phase == "wait")
    # and a dequeue cut short (cancelled) once its take ran on Redis, before its reply came
    world._start_dequeue(receiver)
    dequeue = world.tasks[-1]
    world.play(dequeue, lambda: _sending(dequeue, TAKE.sha))
    world._arrive(dequeue)
    world._cancel_task(dequeue)
    # When the give-back of what it took fails (the link gives up before Redis got it)
    (unpark,) = [t for t in world.tasks if t.kind == "unpark"]
    world.play(unpark, lambda: unpark.phase == "sent")
    world._advance(unpark, partial(unpark.gen.throw, QueueUnavailable("the link gave up")))
    assert unpark.phase == "done"
    # Then the request is not left taken by nobody (the structure check: its token is spare)
    world.check()
    # and the node's next take collects it: its handler gets it, and the call is answered
    world._start_dequeue(receiver)
    world.play(world.tasks[-1], lambda: request_id in world.runs)
    assert world.runs[request_id] == ["r0"]
    answer = next(t for t in world.tasks if t.kind == "answer")
    world.play(answer, lambda: False)
    world.play(call, lambda: False)
    outcome = world.calls[request_id].outcome
    assert outcome is not None and outcome.response is not None
    assert outcome.response.result == world.calls[request_id].request.params
    assert not isinstance(outcome.error, asyncio.CancelledError)


def test_an_enqueue_sent_again_after_a_flush_does_not_run_a_request_twice(world: World) -> None:
    sender, receiver = world.nodes
    # Given an at_most_once call whose enqueue ran, its reply lost on the way back
    world._start_call(sender)
    call = world.tasks[-1]
    request_id = list(world.calls)[-1]
    world.play(call, lambda: _sending_its_enqueue(call))
    world._lose(call, ran=True)
    # and a receiver that took the request and runs it
    world._start_dequeue(receiver)
    world.play(world.tasks[-1], lambda: request_id in world.runs)
    # When Redis is flushed, and the enqueue is then sent again
    world._lose_data(restart=False)
    world.play(call, lambda: call.phase == "wait")
    # and another receiver takes what the endpoint holds
    other = world.add_node("r-other", receiver=True)
    world._start_dequeue(other)
    world.play(world.tasks[-1], lambda: False)
    # Then the request ran once: the enqueue found its node's stamp gone, wrote nothing, and
    # its caller is told the request may have run
    assert world.runs[request_id] == ["r0"]
    outcome = world.calls[request_id].outcome
    assert outcome is not None and isinstance(outcome.error, DataLoss)
    assert outcome.error.maybe_executed and outcome.error.request_id == request_id


def test_an_enqueue_sent_again_after_its_node_declared_the_loss_and_stamped_afresh_is_refused(
    world: World,
) -> None:
    # (found by the simulation: with one stamp key per node, the fresh stamp its next call
    # wrote after the declaration let the retry of an older enqueue through)
    sender, receiver = world.nodes
    # Given an at_most_once call whose enqueue ran, its reply lost, and a receiver running it
    world._start_call(sender)
    first = world.tasks[-1]
    request_id = list(world.calls)[-1]
    world.play(first, lambda: _sending_its_enqueue(first))
    world._lose(first, ran=True)
    world._start_dequeue(receiver)
    world.play(world.tasks[-1], lambda: request_id in world.runs)
    # When Redis is flushed, another call of the node finds its stamp gone (and is queued: it
    # was made after the loss), the node declares the loss, and a third call stamps afresh
    world._lose_data(restart=False)
    for _ in range(2):
        world._start_call(sender)
        later = world.tasks[-1]
        world.play(later, lambda: later.phase == "wait")  # noqa: B023
    assert sender._watch.epoch == 1
    # and the first call's enqueue is then sent again
    world.play(first, lambda: first.phase == "wait")
    # Then it wrote nothing, and its caller is told the request may have run
    outcome = world.calls[request_id].outcome
    assert outcome is not None and isinstance(outcome.error, DataLoss)
    # and a receiver gets the two later calls' requests only
    other = world.add_node("r-other", receiver=True)
    world._start_dequeue(other)
    world.play(world.tasks[-1], lambda: False)
    assert world.runs[request_id] == ["r0"]
