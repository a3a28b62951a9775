"""build_response: handler outcomes become responses; _Pace: when a serve loop may take ahead."""

from __future__ import annotations

from prq.worker import PACE_WEIGHT, TAKE_AHEAD_BELOW_S, _Pace, build_response


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
