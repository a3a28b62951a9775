"""A failing handler is seen on the receiver: its traceback in the log (at most one per endpoint
and error type per LOG_EVERY_S), a count by endpoint and error type in the metrics, and the
caller told which receiver failed, with no traceback."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest
from prometheus_client import REGISTRY

from prq import RemoteError, Request
from prq.core.errors import ServerError
from prq.core.models import Response
from tests.queue_facades import QueueFactory

pytestmark = pytest.mark.integration

LOGGER = "prq.serve.handled"


class StockMissing(Exception):
    """A service's own exception, which says what its caller may see."""

    def __init__(self, sku: str) -> None:
        super().__init__(f"no stock of {sku}")
        self.details = {"sku": sku, "warehouses": ["north", "south"]}


def handler_errors(endpoint: str, error: str) -> float:
    return REGISTRY.get_sample_value(
        "prq_handler_errors_total", {"endpoint": endpoint, "error": error}
    ) or 0.0  # fmt: skip


def failure_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.ERROR]


async def test_a_raising_handler_is_logged_with_its_traceback_and_counted(
    make_queue: QueueFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a receiver whose handler raises, on an endpoint of its own
    endpoint = f"poll://failing-{uuid.uuid4().hex[:8]}"
    sender, receiver = make_queue(), make_queue()

    def handler(request: Request) -> object:
        raise KeyError(f"no such account {request.params}")

    make_queue.serve(receiver, endpoint, handler)

    # When it is called three times in a row
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    for n in range(3):
        with pytest.raises(RemoteError) as raised:
            await asyncio.wait_for(sender.call(endpoint, "open", n, request_id=f"f-{n}"), 10)

    # Then the receiver logged the first failure at ERROR with its traceback and request id,
    # and the next two (inside LOG_EVERY_S) at DEBUG only
    errors = failure_records(caplog)
    assert len(errors) == 1, [r.getMessage() for r in errors]
    logged = errors[0]
    assert "request_id=f-0" in logged.getMessage()
    assert endpoint in logged.getMessage() and "error=KeyError" in logged.getMessage()
    assert logged.exc_info is not None and logged.exc_info[0] is KeyError
    quiet = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.DEBUG]
    assert {r.getMessage().split()[2] for r in quiet} == {"request_id=f-1", "request_id=f-2"}
    # and every failure is counted by endpoint and error type
    assert handler_errors(endpoint, "KeyError") == 3
    # and the caller learns the type, message and receiver, but no traceback
    error = raised.value.error
    assert error.type == "KeyError" and "no such account 2" in error.message
    assert error.details == {"receiver": receiver.node_id}


async def test_a_non_json_result_is_logged_and_counted_as_a_serialization_error(
    make_queue: QueueFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a handler that returns a value JSON cannot carry
    endpoint = f"poll://not-json-{uuid.uuid4().hex[:8]}"
    sender, receiver = make_queue(), make_queue()
    make_queue.serve(receiver, endpoint, lambda request: {"at": object()})

    # When it is called
    caplog.set_level(logging.ERROR, logger=LOGGER)
    with pytest.raises(RemoteError) as raised:
        await asyncio.wait_for(sender.call(endpoint, "m", request_id="nj-1"), 10)

    # Then the failure is logged (no exception to trace) and counted as SerializationError
    assert raised.value.error.type == "SerializationError"
    [logged] = failure_records(caplog)
    assert "request_id=nj-1" in logged.getMessage() and logged.exc_info is None
    assert handler_errors(endpoint, "SerializationError") == 1


async def test_an_exception_s_own_details_reach_the_caller(
    make_queue: QueueFactory,
) -> None:
    # Given a handler whose exception carries details meant for its caller
    endpoint = f"poll://details-{uuid.uuid4().hex[:8]}"
    sender, receiver = make_queue(), make_queue()

    def handler(request: Request) -> object:
        raise StockMissing(str(request.params))

    make_queue.serve(receiver, endpoint, handler)

    # When it is called
    with pytest.raises(RemoteError) as raised:
        await asyncio.wait_for(sender.call(endpoint, "reserve", "sku-9"), 10)

    # Then the caller gets them beside the receiver's node id
    assert raised.value.error.details == {
        "receiver": receiver.node_id,
        "details": {"sku": "sku-9", "warehouses": ["north", "south"]},
    }


async def test_a_handler_s_own_error_response_is_no_handler_failure(
    make_queue: QueueFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a handler that answers with an error Response it built itself
    endpoint = f"poll://chosen-{uuid.uuid4().hex[:8]}"
    sender, receiver = make_queue(), make_queue()
    chosen = ServerError(type="Declined", message="over the limit", details={"limit": 5})
    make_queue.serve(receiver, endpoint, lambda request: Response(id="x", error=chosen))

    # When it is called
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    with pytest.raises(RemoteError) as raised:
        await asyncio.wait_for(sender.call(endpoint, "m"), 10)

    # Then the caller gets that error as it was built, and the receiver logs and counts nothing
    assert raised.value.error == chosen
    assert not [r for r in caplog.records if r.name == LOGGER]
    assert handler_errors(endpoint, "Declined") == 0
