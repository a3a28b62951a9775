"""PulseRouter: which message fires which signal."""

from __future__ import annotations

import threading

from prq.transport.pulse_router import PulseRouter
from prq.transport.signals import ThreadSignal


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


def test_endpoint_pulse_fires_every_take_waiting_on_it() -> None:
    router = make_router()
    with (
        router.watch_take("prq:{e}:pulse", "t1") as one,
        router.watch_take("prq:{e}:pulse", "t2") as two,
        router.watch_take("prq:{f}:pulse", "t3") as other,
    ):
        router.dispatch(b"prq:{e}:pulse", b"")
        assert (one.generation, two.generation, other.generation) == (1, 1, 0)


def test_handoff_fires_only_its_token() -> None:
    router = make_router()
    with (
        router.watch_take("prq:{e}:pulse", "t1") as one,
        router.watch_take("prq:{e}:pulse", "t2") as two,
    ):
        router.dispatch(b"prq:node:n1", b"t|t2|req-1")
        assert (one.generation, two.generation) == (0, 1)
    router.dispatch(b"prq:node:n1", b"t|t2|req-2")  # nobody waits for t2 any more: ignored


def test_wake_all_fires_everything() -> None:
    router = make_router()
    with router.watch_take("prq:{e}:pulse", "t1") as take, router.watch_response("a") as a:
        router.wake_all()
        assert (take.generation, a.generation) == (1, 1)


def test_thread_signal_wait_returns_on_fire_and_on_timeout() -> None:
    signal = ThreadSignal()
    fired = threading.Timer(0.05, signal.fire)
    fired.start()
    signal.wait(0, 5.0)
    assert signal.generation == 1
    signal.wait(1, 0.01)  # nothing fires: returns after the timeout
    assert signal.generation == 1
    fired.join()


def framed(*messages: bytes) -> bytes:
    return b"m|" + b"".join(str(len(m)).encode() + b"|" + m for m in messages)


def test_a_framed_pulse_fires_each_message_it_carries() -> None:
    router = make_router()
    # (a response holding the separator and digits, an empty one, a cancel, a hand-off)
    cancels: list[tuple[str, str]] = []
    router.on_cancel = lambda request_id, reason: cancels.append((request_id, reason))
    with (
        router.watch_response("a") as a,
        router.watch_response("b") as b,
        router.watch_take("prq:{e}:pulse", "t1") as take,
    ):
        data = framed(b'r|a|{"x":"1|2"}', b"r|b|", b"c|a|timeout", b"t|t1|a")
        router.dispatch(b"prq:node:n1", data)
        assert (a.generation, a.payload) == (1, b'{"x":"1|2"}')
        assert (b.generation, b.payload) == (1, None)
        assert take.generation == 1
        assert cancels == [("a", "timeout")]
        assert router.messages == 1


def test_a_damaged_framed_pulse_keeps_what_came_before_the_damage() -> None:
    router = make_router()
    with router.watch_response("a") as a, router.watch_response("b") as b:
        good = framed(b"r|a|1")
        for tail in (b"x|r|b|1", b"99|r|b|1", b"5r|b|1", b"|r|b|", b"-1|r|b|1"):
            router.dispatch(b"prq:node:n1", good + tail)
        # a framed message inside a framed one is not unpacked
        router.dispatch(b"prq:node:n1", framed(framed(b"r|b|1")))
        assert a.generation == 5
        assert b.generation == 0
