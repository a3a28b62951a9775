"""The watch thread of a blocking node plans its beats while worker threads hold and release
requests: the plan reads a snapshot of the leases, never a dict another thread is changing."""

from __future__ import annotations

import threading

import pytest

from prq import QueueSettings, Request
from prq.core.keys import KeySchema
from prq.core.lifecycle import DeliveryInfo, PendingRequest
from prq.node.heartbeats import Liveness
from prq.protocol.flows.context import Context

#: Holds and releases made while the plan is read again and again.
CHURN = 20_000


def pending(n: int) -> PendingRequest:
    request = Request(endpoint="poll://churn", method="m", id=f"r-{n}")
    return PendingRequest(request, DeliveryInfo(attempt=1, delivery_hash="h"), "token")


@pytest.mark.usefixtures("frequent_switches")
def test_beats_are_planned_while_other_threads_hold_and_release_requests() -> None:
    # Given a node's leases, many of them due for a look
    settings = QueueSettings(heartbeat_initial_delay_s=0, poll_interval_s=0.01)
    liveness = Liveness(Context(KeySchema("prq"), settings, "node"))
    for n in range(200):
        liveness.hold(pending(n), 0.0)
        liveness.send(f"s-{n}", "poll://churn", 0.0)
    errors: list[BaseException] = []
    done = threading.Event()

    def churn() -> None:
        try:
            for n in range(200, 200 + CHURN):
                liveness.hold(pending(n), 0.0)
                liveness.send(f"s-{n}", "poll://churn", 0.0)
                liveness.release(f"r-{n - 100}")
                liveness.release(f"s-{n - 100}")
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    # When a worker thread holds and releases requests while the watch plans its beats
    worker = threading.Thread(target=churn)
    worker.start()
    plans = 0
    try:
        while not done.is_set():
            liveness.due(plans + 1.0)
            liveness.next_due_in(plans + 1.0)
            plans += 1
    except RuntimeError as exc:
        errors.append(exc)
    finally:
        worker.join(30)

    # Then no plan failed on a lease table that changed under it
    assert errors == [] and plans > 0
