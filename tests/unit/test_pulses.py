"""PulseRouter: which message fires which signal."""

from __future__ import annotations

import threading

from prq.pulses import PulseRouter, ThreadSignal


def make_router() -> PulseRouter[ThreadSignal]:
    return PulseRouter("prq:node:n1", ThreadSignal)


def test_response_pulse_fires_only_its_request() -> None:
    router = make_router()
    with router.watch_response("a") as a, router.watch_response("b") as b:
        router.dispatch(b"prq:node:n1", b'r|a|{"id":"a"}')
        assert (a.generation, a.payload) == (1, b'{"id":"a"}')
        assert b.generation == 0
        router.dispatch(b"prq:node:n1", b"r|b|")
        assert (b.generation, b.payload) == (1, None)
    assert router.watched_responses == 0


def test_unknown_and_garbled_messages_fire_nothing() -> None:
    router = make_router()
    with router.watch_response("a") as a:
        for data in (b"", b"r", b"r|", b"x|a|1", b"r|zzz|1", b"\xff|\xfe"):
            router.dispatch(b"prq:node:n1", data)
        router.dispatch(b"other:channel", b"r|a|1")
        assert a.generation == 0


def test_endpoint_signal_is_shared_and_fired_by_its_channel() -> None:
    router = make_router()
    first = router.endpoint_signal("prq:{e}:pulse")
    assert router.endpoint_signal("prq:{e}:pulse") is first
    router.dispatch(b"prq:{e}:pulse", b"")
    assert first.generation == 1


def test_wake_all_fires_everything() -> None:
    router = make_router()
    endpoint = router.endpoint_signal("prq:{e}:pulse")
    with router.watch_response("a") as a:
        router.wake_all()
        assert (endpoint.generation, a.generation) == (1, 1)


def test_thread_signal_wait_returns_on_fire_and_on_timeout() -> None:
    signal = ThreadSignal()
    fired = threading.Timer(0.05, signal.fire)
    fired.start()
    signal.wait(0, 5.0)
    assert signal.generation == 1
    signal.wait(1, 0.01)  # nothing fires: returns after the timeout
    assert signal.generation == 1
    fired.join()
