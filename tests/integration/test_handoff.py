"""Hand-offs to idle receivers: confirmed before they count as a pickup, taken back when their
receiver is gone; receivers stopped while idle lose no call; pickup deadlines on Redis's clock.

A request enqueued while a receiver is parked goes straight to that receiver's take. A receiver
process that died while parked (SIGKILL, a crash) still has its parks in Redis for up to a poll
interval, so a hand-off can reach a dead take; it must then go to a live receiver, never be run
by nobody, and never be reported as maybe executed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from prq import PickupTimeout, Request, RequestState, Response
from prq.bulk import BulkClient
from prq.core.config import QueueSettings
from prq.core.keys import EndpointKeys, KeySchema
from prq.protocol.scripts.loading import READ_RESPONSE, TAKE, UNPARK
from prq.protocol.scripts.redelivery import Redelivery
from prq.protocol.scripts.take import parse_take, parse_unpark, take_call, unpark_call
from tests.queue_facades import AnyQueue, QueueFactory, SyncQueueAdapter, wait_for_state
from tests.queued import take_as
from tests.redis_servers import CommandMonitor, async_wait_until

pytestmark = pytest.mark.integration

#: The receiver process (a plain `serve`, as in the README's quickstart).
SERVE_CHILD = Path(__file__).with_name("serve_child.py")
ROOT = Path(__file__).resolve().parents[2]
#: Far above every bound below: a call that waits for it is a call the fix did not save.
RECEIVER_TIMEOUT_S = 30.0
#: The hand-off confirmation window the tests use.
CONFIRM_S = 0.5
#: A call must end well inside the receiver timeout (a few confirmation windows and polls).
CALL_BOUND_S = 10.0


def parks_of(client: redis.Redis, keys: EndpointKeys, node: str) -> list[bytes]:
    """The park tokens of `node` on the endpoint."""
    parks: dict[bytes, bytes] = client.hgetall(keys.parks)  # type: ignore[assignment]
    return [token for token, park in parks.items() if park.startswith(f"{node}|".encode())]


@asynccontextmanager
async def serve_child(
    redis_url: str, prefix: str, endpoint: str, facade: str, concurrency: int
) -> AsyncIterator[tuple[subprocess.Popen[str], str]]:
    """A receiver process serving `endpoint`, and its node id; killed at the end if alive."""
    command = [sys.executable, str(SERVE_CHILD), redis_url, prefix, endpoint, facade,
               str(concurrency)]  # fmt: skip
    child = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_interruptible,
    )
    try:
        assert child.stdout is not None
        node = (await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 30)).strip()
        assert node, child.stderr.read() if child.stderr else ""
        yield child, node
    finally:
        if child.poll() is None:
            child.kill()
        await asyncio.to_thread(child.communicate, timeout=30)


def _interruptible() -> None:
    """In the child before it runs: SIGINT delivered as a terminal's Ctrl-C is, whatever the
    suite's own process inherited (a process started in the background of a shell without job
    control starts with SIGINT ignored, and so would its children)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def stop_child(child: subprocess.Popen[str], how: str) -> int:
    """Send `how` (SIGKILL, SIGTERM or SIGINT) and wait (bounded) for the process to end."""
    child.send_signal(signal.Signals[how])
    return await asyncio.to_thread(child.wait, 30)


def raw(queue: AnyQueue) -> Any:
    return queue.raw if isinstance(queue, SyncQueueAdapter) else queue


def skew_clock(queue: AnyQueue, delta_ms: int) -> None:
    """Make the node's wall clock run `delta_ms` off (Redis's clock stays right)."""
    node = raw(queue)
    node.ctx = dataclasses.replace(node.ctx, wall_ms=lambda: int(time.time() * 1000) + delta_ms)


def park_silently(client: redis.Redis, keys: EndpointKeys, token: str, node: str) -> None:
    """Park a take as a receiver that then never collects what it is handed."""
    settings = QueueSettings()
    client.script_load(TAKE.source)
    call = take_call(
        keys, token, node, 2000, 1, 100, 60_000, 60_000, 60_000, 86_400_000, 60_000,
        Redelivery.of(settings),
    )  # fmt: skip
    assert parse_take(client.execute_command(*call.args)).items == []  # type: ignore[no-untyped-call]


def live(pid_marker: str) -> Callable[[Request], dict[str, str]]:
    def handle(_request: Request) -> dict[str, str]:
        return {"pid": pid_marker}

    return handle


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
async def test_a_receiver_stopped_while_idle_swallows_no_call(
    make_queue: QueueFactory,
    facade: str,
    redis_url: str,
    redis_client: redis.Redis,
    key_prefix: str,
    how: str,
) -> None:
    # Given a receiver process parked on an endpoint (two takes), and a live receiver that
    # parked after it (so the dead one's parks come first)
    endpoint = f"poll://idle-stop-{how.lower()}"
    keys = KeySchema(key_prefix).endpoint(endpoint)
    timings: dict[str, Any] = {
        "receiver_timeout_s": RECEIVER_TIMEOUT_S,
        "handoff_confirm_s": CONFIRM_S,
    }
    async with serve_child(redis_url, key_prefix, endpoint, facade, 2) as (child, node):
        await async_wait_until(lambda: parks_of(redis_client, keys, node), 30, 0.02, "parked")
        receiver = make_queue(**timings)
        make_queue.serve(receiver, endpoint, live("live"), concurrency=2)
        await async_wait_until(
            lambda: parks_of(redis_client, keys, receiver.node_id), 10, 0.02, "live receiver parked"
        )
        # When the first receiver is stopped while idle
        code = await stop_child(child, how)
        if how == "SIGTERM":
            # (a plain serve stops gracefully: it withdraws its parks and exits normally)
            assert code == 0, child.stderr.read() if child.stderr else ""
            assert parks_of(redis_client, keys, node) == []
        # Then every next call is answered by the live receiver, well inside the receiver
        # timeout, and none fails
        sender = make_queue(**timings)
        for n in range(4):
            result = await sender.call(endpoint, "who", {"n": n}, timeout_s=CALL_BOUND_S)
            assert result == {"pid": "live"}


async def test_a_call_handed_to_a_dead_receiver_with_no_other_times_out_unrun(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given an endpoint whose only receiver died while parked
    endpoint = "poll://dead-and-alone"
    keys = KeySchema(key_prefix).endpoint(endpoint)
    park_silently(redis_client, keys, uuid.uuid4().hex, "dead-node")
    sender = make_queue(receiver_timeout_s=RECEIVER_TIMEOUT_S, handoff_confirm_s=CONFIRM_S)
    # When a call is made
    with pytest.raises(PickupTimeout) as caught:
        await sender.call(endpoint, "m", pickup_timeout_s=3, timeout_s=CALL_BOUND_S)
    # Then it is a pickup timeout: it never ran, and the caller is told so
    assert caught.value.maybe_executed is False
    assert redis_client.hlen(keys.parks) == 0


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT"])
async def test_a_receiver_stopped_while_busy_finishes_and_answers(
    make_queue: QueueFactory,
    facade: str,
    redis_url: str,
    redis_client: redis.Redis,
    key_prefix: str,
    how: str,
) -> None:
    # Given a receiver process working on a call
    endpoint = f"poll://busy-stop-{how.lower()}"
    keys = KeySchema(key_prefix).endpoint(endpoint)
    async with serve_child(redis_url, key_prefix, endpoint, facade, 1) as (child, node):
        await async_wait_until(lambda: parks_of(redis_client, keys, node), 30, 0.02, "parked")
        sender = make_queue(receiver_timeout_s=RECEIVER_TIMEOUT_S)
        request = Request(endpoint=endpoint, method="work", params={"sleep_s": 1.5})
        call = asyncio.create_task(sender.queue_and_wait(request, timeout_s=CALL_BOUND_S))
        await wait_for_state(sender, request.id, RequestState.TAKEN)
        # When it is sent SIGTERM (a deploy) or SIGINT (Ctrl-C in a terminal)
        code = await stop_child(child, how)
        # Then it finishes the call, answers it, and exits normally, with no traceback
        response = await asyncio.wait_for(call, CALL_BOUND_S)
        assert response.error is None and response.result == {"pid": child.pid}
        errors = child.stderr.read() if child.stderr else ""
        assert code == 0 and "Traceback" not in errors, errors


async def test_a_handoff_given_back_unconfirmed_goes_to_another_receiver_uncounted(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given a parked take, and a call whose request was handed to it
    endpoint = "poll://given-back"
    keys = KeySchema(key_prefix).endpoint(endpoint)
    token = uuid.uuid4().hex
    park_silently(redis_client, keys, token, "stopping-node")
    sender = make_queue(receiver_timeout_s=RECEIVER_TIMEOUT_S, handoff_confirm_s=30)
    request = Request(endpoint=endpoint, method="m")
    call = asyncio.create_task(sender.queue_and_wait(request, timeout_s=CALL_BOUND_S))
    hash_key = keys.request(request.id)
    await async_wait_until(lambda: redis_client.hget(hash_key, "st") == b"handed", 10, 0.01)
    # (not picked up: status says queued)
    assert (await sender.status(request.id)).state == RequestState.QUEUED
    # When the take's receiver stops taking (unpark) without collecting it
    redis_client.script_load(UNPARK.source)
    redelivery = Redelivery.of(QueueSettings())
    unpark = unpark_call(keys, token, redelivery)
    assert parse_unpark(redis_client.execute_command(*unpark.args)) == 1  # type: ignore[no-untyped-call]
    # Then the request is queued again, no attempt counted, and another receiver runs it
    assert redis_client.hmget(hash_key, "st", "att") == [b"queued", None]  # no attempt yet
    receiver = make_queue()
    pending = await receiver.dequeue(endpoint, timeout_s=5)
    assert pending is not None and pending.id == request.id and pending.delivery.attempt == 1
    await receiver.apply_response(Response(id=pending.id, result="ok"))
    response = await asyncio.wait_for(call, CALL_BOUND_S)
    assert response.result == "ok"


async def test_a_cancelled_dequeue_leaves_no_park_behind(
    make_queue: QueueFactory, facade: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    if facade == "sync":
        pytest.skip("a blocking dequeue cannot be cancelled: only its thread's end stops it")
    # Given a dequeue waiting (parked) with a long poll interval
    endpoint = "poll://cancelled-dequeue"
    keys = KeySchema(key_prefix).endpoint(endpoint)
    receiver = make_queue(poll_interval_s=30, dequeue_timeout_s=30)
    waiting = asyncio.create_task(receiver.dequeue(endpoint))
    await async_wait_until(lambda: redis_client.hlen(keys.parks) == 1, 10, 0.01, "parked")
    # When it is cancelled (as asyncio.wait_for does when it times out)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    # Then its park is withdrawn at once, so nothing is handed to a take that is gone
    await async_wait_until(lambda: redis_client.hlen(keys.parks) == 0, 5, 0.01, "park withdrawn")
    sender = make_queue()
    request = Request(endpoint=endpoint, method="m")
    call = asyncio.create_task(sender.queue_and_wait(request, timeout_s=CALL_BOUND_S))
    await wait_for_state(sender, request.id, RequestState.QUEUED)
    assert redis_client.hget(keys.request(request.id), "st") == b"queued"
    other = make_queue()
    pending = await other.dequeue(endpoint, timeout_s=5)
    assert pending is not None and pending.delivery.attempt == 1
    await other.apply_response(Response(id=pending.id, result="ok"))
    assert (await asyncio.wait_for(call, CALL_BOUND_S)).result == "ok"


async def test_pickup_deadlines_are_judged_on_redis_clock(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given a sender whose clock runs ten minutes behind and a receiver ten minutes ahead
    endpoint = "poll://skewed-clocks"
    sender, receiver = make_queue(), make_queue()
    skew_clock(sender, -600_000)
    skew_clock(receiver, 600_000)
    # When the sender calls with a short pickup timeout, queued before the receiver takes
    request = Request(endpoint=endpoint, method="m")
    call = asyncio.create_task(
        sender.queue_and_wait(request, pickup_timeout_s=5, timeout_s=CALL_BOUND_S)
    )
    await wait_for_state(sender, request.id, RequestState.QUEUED)
    # Then the receiver still takes it: the deadline is 5 s after the enqueue by Redis's clock
    pending = await receiver.dequeue(endpoint, timeout_s=5)
    assert pending is not None and pending.id == request.id
    await receiver.apply_response(Response(id=pending.id, result="ok"))
    assert (await asyncio.wait_for(call, CALL_BOUND_S)).result == "ok"
    stored = redis_client.hget(KeySchema(key_prefix).endpoint(endpoint).request(request.id), "pd")
    assert abs(int(stored or 0) - time.time() * 1000) < 60_000  # no node's clock in it


async def test_a_request_is_not_handed_past_queued_work(
    make_queue: QueueFactory, redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given a parked take, and a bulk batch queued meanwhile (bulk enqueues hand nothing off)
    endpoint = "poll://queued-first"
    keys = KeySchema(key_prefix).endpoint(endpoint)
    park_silently(redis_client, keys, uuid.uuid4().hex, "slow-node")
    with BulkClient.from_url(redis_url, prefix=key_prefix) as bulk:
        batch = [Request(endpoint=endpoint, method="bulk", producer="job") for _ in range(3)]
        assert bulk.enqueue_many(batch).accepted == 3
    # When a caller sends a request
    sender = make_queue()
    request = Request(endpoint=endpoint, method="interactive")
    call = asyncio.create_task(sender.queue_and_wait(request, timeout_s=CALL_BOUND_S))
    await async_wait_until(lambda: redis_client.exists(keys.request(request.id)), 10, 0.01)
    # Then it waits its turn in the queue instead of jumping it through the park
    assert redis_client.hget(keys.request(request.id), "st") == b"queued"
    receiver = make_queue()
    taken = [await receiver.dequeue(endpoint, timeout_s=5) for _ in range(4)]
    methods = [p.request.method for p in taken if p is not None]
    assert sorted(methods[:2]) == ["bulk", "interactive"]  # producers take turns
    for pending in taken:
        assert pending is not None
        await receiver.apply_response(Response(id=pending.id, result="ok"))
    assert (await asyncio.wait_for(call, CALL_BOUND_S)).result == "ok"


async def test_a_take_whose_receipt_holds_only_cancelled_requests_takes_afresh(
    make_queue: QueueFactory, redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given two queued requests, and a take that got the first but whose reply was lost (its
    # receiver will send the same take again, with the same token)
    endpoint = "poll://receipt-of-cancelled"
    keys = KeySchema(key_prefix).endpoint(endpoint)
    with BulkClient.from_url(redis_url, prefix=key_prefix) as bulk:
        batch = [Request(endpoint=endpoint, method="m", id=f"r-{n}") for n in range(2)]
        assert bulk.enqueue_many(batch).accepted == 2
    token = uuid.uuid4().hex
    settings = QueueSettings()
    call = take_call(
        keys, token, "receiver", 2000, 1, 100, 60_000, 60_000, 0, 86_400_000, 60_000,
        Redelivery.of(settings),
    )  # fmt: skip
    redis_client.script_load(TAKE.source)
    first = parse_take(redis_client.execute_command(*call.args))  # type: ignore[no-untyped-call]
    assert [item.request_id for item in first.items] == ["r-0"]
    # When that request is cancelled before the take is sent again
    assert await make_queue().cancel("r-0")
    again = parse_take(redis_client.execute_command(*call.args))  # type: ignore[no-untyped-call]
    # Then the take goes on as a fresh one instead of coming back empty until its receipt expires
    assert [item.request_id for item in again.items] == ["r-1"]


async def test_a_threaded_serve_stops_on_sigterm_whichever_thread_the_kernel_picks(
    redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given a plain sync serve with four threads, stopped and continued just before SIGTERM (a
    # process signalled while it wakes up: the kernel then often delivers SIGTERM to one of the
    # serve threads, which Python only handles once the main thread wakes)
    endpoint = "poll://threaded-sigterm"
    keys = KeySchema(key_prefix).endpoint(endpoint)
    for _ in range(4):
        async with serve_child(redis_url, key_prefix, endpoint, "sync", 4) as (child, node):
            await async_wait_until(lambda: parks_of(redis_client, keys, node), 30, 0.02, "parked")
            # When it gets SIGSTOP, SIGCONT and SIGTERM in quick succession
            for sig in (signal.SIGSTOP, signal.SIGCONT, signal.SIGTERM):
                child.send_signal(sig)
            # Then it still stops gracefully, at once
            code = await asyncio.to_thread(child.wait, 15)
            assert code == 0, child.stderr.read() if child.stderr else ""


@pytest.mark.one_server  # MONITOR watches one server
async def test_a_request_a_take_gave_back_unrun_is_withdrawn_as_never_run(
    make_queue: QueueFactory, redis_client: redis.Redis, redis_admin_url: str, key_prefix: str
) -> None:
    # Given an at_most_once call with a 3 s pickup window, taken by a receiver, and its caller
    # having read it taken (its read runs after the take, as MONITOR shows)
    endpoint = "poll://given-back-unpicked"
    keys = KeySchema(key_prefix).endpoint(endpoint)
    sender = make_queue(receiver_timeout_s=RECEIVER_TIMEOUT_S)
    request = Request(endpoint=endpoint, method="m")
    token = uuid.uuid4().hex
    with CommandMonitor(redis_admin_url, keep=True) as monitor:
        call = asyncio.create_task(sender.queue_and_wait(request, pickup_timeout_s=3.0))
        await wait_for_state(sender, request.id, RequestState.QUEUED)
        taken = take_as(redis_client, key_prefix, endpoint, token)
        assert [item.request_id for item in taken] == [request.id]

        def read_after_take() -> bool:
            commands = [command for _, command in monitor.commands]
            takes = [i for i, c in enumerate(commands) if TAKE.sha in c and token in c]
            return bool(takes) and any(
                READ_RESPONSE.sha in c and request.id in c for c in commands[takes[0] + 1 :]
            )

        await async_wait_until(read_after_take, 10, 0.01, "the caller's read of it taken")

    # When the take is cut short (its receiver gives it back unrun: unpark), and no receiver
    # picks it up again before its window ends
    redis_client.script_load(UNPARK.source)
    unpark = unpark_call(keys, token, Redelivery.of(QueueSettings()))
    assert parse_unpark(redis_client.execute_command(*unpark.args)) == 1  # type: ignore[no-untyped-call]
    assert redis_client.hmget(keys.request(request.id), "st", "att") == [b"queued", None]

    # Then its caller is told it was never picked up and never ran (PickupTimeout), not that a
    # receiver that took it went silent (ReceiverLost, may have run)
    with pytest.raises(PickupTimeout) as ended:
        await asyncio.wait_for(call, CALL_BOUND_S)
    assert ended.value.maybe_executed is False
