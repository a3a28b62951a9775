"""Scenario 12: 64 asyncio tasks of one node each issue tagged requests while 30% of the calls are
cancelled (task.cancel()) at random points of their Redis call path. The node talks to Redis
through the fault proxy with added latency, so a cancellation lands mid-round-trip (a command
sent, its reply still on the way) as often as between round trips. No caller ever gets another
call's result, the service never runs a request with another call's params, and the node's
connection count does not grow.

The in-process version without a proxy is tests/integration/test_cancel_races.py::
test_callers_cancelled_at_random_points_see_no_cross_talk; here the receiver is a separate node
process with a ledger, and the round trips are slow enough to be cut in half.

The send variant: 64 tasks `send`, and withdraw 30% of their sends at random points through the
same slow link. A send withdrawn in time gets no callback and never runs; every other one gets
exactly one callback, with its own echo."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Callable
from functools import partial

import pytest
import redis

from prq import AsyncQueue, Response
from prq.embedded import EmbeddedRedis
from prq.facade.send import SendHandle
from tests.fault.checker import check_nodes
from tests.fault.nodes import NodeFactory, NodeProcess
from tests.fault.proxy import FaultProxy
from tests.fault.scenarios import ENDPOINT, figures, starts
from tests.fault.timings import fault_redis_settings, fault_settings
from tests.redis_servers import async_wait_until

pytestmark = pytest.mark.fault

TASKS, CALLS_PER_TASK = 64, 40
#: Share of calls cancelled.
CANCEL_SHARE = 0.3
#: Latency the proxy adds to every chunk, each way, ms.
LATENCY_MS = 5.0
#: A cancelled call is cancelled a random 0 to this many ms after it began: inside its first
#: round trips (each takes at least 2 x LATENCY_MS).
CANCEL_WITHIN_MS = 6 * LATENCY_MS


async def _slow_node(
    nodes: NodeFactory,
    make_proxy: Callable[..., FaultProxy],
    prefix: str,
    node_id: str,
    handler_ms: float = 0.0,
) -> tuple[NodeProcess, FaultProxy, AsyncQueue]:
    """A receiver process echoing each call's params (after `handler_ms`), and a node (not
    started) whose link to Redis adds LATENCY_MS in both directions."""
    handler = {"handler": "sleep", "handler_ms": handler_ms} if handler_ms else {}
    receiver = await asyncio.to_thread(nodes.receiver, "r1", concurrency=16, **handler)
    link = make_proxy()
    link.latency(LATENCY_MS)
    settings = fault_redis_settings(link.url)
    node = AsyncQueue(settings, prefix=prefix, settings=fault_settings(), node_id=node_id)
    return receiver, link, node


@pytest.mark.timeout(90)
async def test_callers_cancelled_mid_round_trip_see_no_cross_talk(
    nodes: NodeFactory,
    make_proxy: Callable[..., FaultProxy],
    fault_redis: EmbeddedRedis,
    fault_client: redis.Redis,
    fault_prefix: str,
) -> None:
    # Given a receiver process echoing each call's params, and a node whose link to Redis adds
    # latency in both directions
    receiver, link, node = await _slow_node(nodes, make_proxy, fault_prefix, "callers")
    rng = random.Random()
    sent: dict[str, str] = {}  # request id -> tag
    crosstalk: list[tuple[str, object]] = []
    completed = cancelled = errors = 0
    async with node:
        # (one call first, so every connection the node keeps is open before counting)
        assert await node.call(ENDPOINT, "echo", {"tag": "warm-up"}) == {"tag": "warm-up"}
        node_links_before = link.open_connections
        server_clients_before = len(fault_client.client_list())

        async def caller(task: int) -> None:
            nonlocal completed, cancelled, errors
            for n in range(CALLS_PER_TASK):
                tag, request_id = f"{task}/{n}", uuid.uuid4().hex
                sent[request_id] = tag
                call = asyncio.ensure_future(
                    node.call(ENDPOINT, "echo", {"tag": tag}, request_id=request_id)
                )
                if rng.random() < CANCEL_SHARE:
                    # a random point of its Redis call path
                    await asyncio.sleep(rng.uniform(0, CANCEL_WITHIN_MS) / 1000.0)
                    call.cancel()
                try:
                    result = await call
                except asyncio.CancelledError:
                    cancelled += 1
                    continue
                except Exception:
                    errors += 1
                    raise
                completed += 1
                if result != {"tag": tag}:
                    crosstalk.append((tag, result))

        # When 30% of the calls are cancelled at random points
        started = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*(caller(t) for t in range(TASKS))), 75)
        took = time.monotonic() - started

        # Then the node's connections did not pile up (once its background cancels are done)
        await async_wait_until(
            lambda: link.open_connections <= node_links_before, 10, 0.05, "links settle"
        )
        node_links_after = link.open_connections
        server_clients_after = len(fault_client.client_list())
    await asyncio.to_thread(receiver.stop)

    # And no caller got another's result, and the service never ran one call with another's
    # params (every execution's tag is the one sent with that request id)
    ledger = starts(receiver)
    wrong_params = [
        r["id"] for r in ledger if r["id"] in sent and r["params"]["tag"] != sent[r["id"]]
    ]
    result = check_nodes(nodes.nodes, name="S12", redis_client=fault_client, prefix=fault_prefix)
    figures(
        "S12",
        tasks=TASKS,
        calls=len(sent),
        completed=completed,
        cancelled=cancelled,
        errors=errors,
        executions=len(ledger),
        latency_ms=LATENCY_MS,
        took_s=took,
        cross_talk=len(crosstalk),
        wrong_params=len(wrong_params),
        node_links=f"{node_links_before}->{node_links_after}",
        server_clients=f"{server_clients_before}->{server_clients_after}",
        keys_without_ttl=len(result.keys_without_ttl),
    )
    assert crosstalk == [] and wrong_params == []
    assert completed > 0 and cancelled > 0.2 * len(sent)
    assert node_links_after <= node_links_before
    assert server_clients_after <= server_clients_before
    assert result.keys_without_ttl == []


#: Sends per task in the send variant.
SENDS_PER_TASK = 20
#: Share of sends withdrawn, and how long after `send` returned (random, up to this many ms).
WITHDRAW_SHARE, WITHDRAW_WITHIN_MS = 0.3, 6 * LATENCY_MS
#: How long the receiver's echo takes in the send variant.
SEND_HANDLER_MS = 10.0


def _got_response(runs: list[object], response: Response) -> None:
    runs.append(response.result)


@pytest.mark.timeout(90)
async def test_sends_withdrawn_mid_round_trip_get_one_callback_or_none(
    nodes: NodeFactory,
    make_proxy: Callable[..., FaultProxy],
    fault_redis: EmbeddedRedis,
    fault_client: redis.Redis,
    fault_prefix: str,
) -> None:
    # Given a receiver process echoing each call's params, and a node whose link to Redis adds
    # latency in both directions
    # (each echo takes SEND_HANDLER_MS, so that sends queue up while the receiver is busy: a
    # withdrawal can then come before pickup whatever the host's speed; with instant echoes
    # an idle receiver takes each send within a millisecond, before any withdrawal arrives)
    receiver, _, node = await _slow_node(
        nodes, make_proxy, fault_prefix, "senders", handler_ms=SEND_HANDLER_MS
    )
    rng = random.Random()
    sent: dict[str, str] = {}  # request id -> tag
    outcomes: dict[str, list[object]] = {}  # request id -> what each callback run got
    withdrawn: dict[str, bool] = {}  # request id -> what withdraw() answered
    handles: list[SendHandle] = []
    async with node:

        async def sender(task: int) -> None:
            for n in range(SENDS_PER_TASK):
                tag, request_id = f"{task}/{n}", uuid.uuid4().hex
                sent[request_id] = tag
                runs = outcomes.setdefault(request_id, [])
                handle = await node.send(
                    node.build_request(ENDPOINT, "echo", {"tag": tag}, request_id=request_id),
                    on_response=partial(_got_response, runs),
                    on_failure=runs.append,
                )
                handles.append(handle)
                if rng.random() < WITHDRAW_SHARE:
                    # a random point of the request's way: queued, taken, running, answered
                    await asyncio.sleep(rng.uniform(0, WITHDRAW_WITHIN_MS) / 1000.0)
                    withdrawn[request_id] = await handle.withdraw()

        # When 30% of the sends are withdrawn at random points
        started = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*(sender(t) for t in range(TASKS))), 75)
        await async_wait_until(
            lambda: all(h.finished for h in handles), 30, 0.01, "every outcome delivered"
        )
        took = time.monotonic() - started
    await asyncio.to_thread(receiver.stop)

    # Then a send withdrawn in time got no callback and never ran; every other send got exactly
    # one callback, on_response with its own echo
    executed = {r["id"] for r in starts(receiver)}
    in_time = [rid for rid, mine in withdrawn.items() if mine]
    late = [rid for rid, mine in withdrawn.items() if not mine]
    wrong = {
        rid: runs
        for rid, runs in outcomes.items()
        if runs != ([] if withdrawn.get(rid) else [{"tag": sent[rid]}])
    }
    result = check_nodes(
        nodes.nodes, name="S12-send", redis_client=fault_client, prefix=fault_prefix
    )
    figures(
        "S12-send",
        tasks=TASKS,
        sends=len(sent),
        withdrawn_in_time=len(in_time),
        withdraw_too_late=len(late),
        executions=len(executed),
        latency_ms=LATENCY_MS,
        took_s=took,
        wrong_outcomes=len(wrong),
        keys_without_ttl=len(result.keys_without_ttl),
    )
    assert wrong == {}, list(wrong.items())[:5]
    assert in_time, "no withdrawal came before pickup"
    assert executed.isdisjoint(in_time)
    assert executed == set(sent) - set(in_time)
    assert result.keys_without_ttl == []
