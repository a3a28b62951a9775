"""build_response: handler outcomes become responses."""

from __future__ import annotations

from prq.worker import build_response


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
