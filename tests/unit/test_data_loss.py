"""DataLossWatch's enqueue counters: refreshed by every check, compared only while vouched for,
a new life when the vouching lapsed, and no longer watched once unused for a list TTL."""

from __future__ import annotations

from prq._types import Reply
from prq.config import QueueSettings
from prq.data_loss import Check, DataLossWatch
from prq.flows import Context
from prq.keys import KeySchema

#: A list TTL of 100 s: a check's refresh vouches for a counter 50 s from when it was sent.
LIST_TTL_S = 100.0
VOUCHED_S = 50.0
E = "poll://e"


def watch() -> DataLossWatch:
    settings = QueueSettings(list_ttl_s=LIST_TTL_S, data_loss_check_interval_s=1.0)
    return DataLossWatch(Context(KeySchema("prq"), settings, "node"))


def seq_key(dl: DataLossWatch, endpoint: str = E) -> str:
    return dl.ctx.keys.endpoint(endpoint).sequence


def answer(check: Check, *counters: tuple[int, bool]) -> list[Reply]:
    """The replies Redis gives: the canary stepped, then per endpoint (value, key was there)."""
    replies: list[Reply] = [1 if check.last is None else check.last + 1]
    for value, present in counters:
        replies += [str(value).encode() if present else None, int(present)]
    return replies


def vouched(dl: DataLossWatch, value: int, now: float) -> None:
    """A check at `now` finds the counter at `value` and refreshes it."""
    check = dl.check(now)
    assert dl.settle(check, answer(check, (value, True)), now) is None


def test_a_check_reads_and_refreshes_the_counter_of_every_endpoint_it_compares() -> None:
    dl = watch()
    dl.observe(E, 3, 0.0)
    calls = [call.args for call in dl.check(0.0).calls[1:]]
    assert calls == [("GET", seq_key(dl)), ("PEXPIRE", seq_key(dl), int(LIST_TTL_S * 1000))]


def test_a_new_endpoint_brings_a_check_at_once() -> None:
    dl = watch()
    woken: list[bool] = []
    dl.wake = lambda: woken.append(True)
    dl.check(0.0)
    assert not dl.check_due(0.5)
    dl.observe(E, 1, 0.5)
    assert dl.check_due(0.5)
    assert woken == [True]
    dl.observe(E, 2, 0.6)  # known already: no more
    assert woken == [True]


def test_a_floor_is_compared_only_once_a_check_refreshed_its_counter() -> None:
    dl = watch()
    dl.observe(E, 5, 0.0)
    assert dl.floor(E, 0.0) is None
    first = dl.check(0.0)
    assert first.floors == {E: None}
    assert dl.settle(first, answer(first, (5, True)), 0.0) is None
    floor = dl.floor(E, 1.0)
    assert floor is not None and floor.value == 5


def test_a_counter_below_a_vouched_floor_is_data_loss() -> None:
    dl = watch()
    dl.observe(E, 5, 0.0)
    vouched(dl, 5, 0.0)
    check = dl.check(1.0)
    assert dl.settle(check, answer(check, (2, True)), 1.0) == (
        "enqueue counter of 'poll://e' went back from 5 to 2"
    )
    # and a take's reading, the same
    floor = dl.floor(E, 2.0)
    assert dl.read(E, floor, 1, 2.0) == "enqueue counter of 'poll://e' went back from 5 to 1"


def test_a_counter_gone_once_the_vouching_lapsed_is_no_loss_and_starts_a_new_life() -> None:
    # Given a counter vouched for until 50 s (a check sent at 0 s refreshed it)
    dl = watch()
    dl.observe(E, 5, 0.0)
    vouched(dl, 5, 0.0)
    life = dl.life(E, 1.0)
    # When no check refreshes it for as long (Redis away, the node paused) and it is gone
    assert dl.floor(E, VOUCHED_S) is None
    check = dl.check(VOUCHED_S)
    assert dl.settle(check, answer(check, (0, False)), VOUCHED_S) is None
    # Then nothing is declared, and sequence numbers start a new life
    assert dl.epoch == 0
    assert dl.life(E, VOUCHED_S) != life
    # And a refresh that found no counter vouches for nothing
    assert dl.floor(E, VOUCHED_S + 1) is None


def test_a_take_sent_while_vouched_is_not_judged_once_the_vouching_lapsed() -> None:
    dl = watch()
    dl.observe(E, 5, 0.0)
    vouched(dl, 5, 0.0)
    floor = dl.floor(E, VOUCHED_S - 1)
    assert floor is not None
    assert dl.read(E, floor, 1, VOUCHED_S + 1) is None
    assert dl.epoch == 0


def test_each_check_keeps_the_counter_vouched_for() -> None:
    dl = watch()
    dl.observe(E, 5, 0.0)
    life = dl.life(E, 0.0)
    for now in (0.0, 30.0, 60.0, 90.0):  # each well within the 50 s the one before vouched
        vouched(dl, 5, now)
    assert dl.life(E, 95.0) == life
    floor = dl.floor(E, 95.0)
    assert floor is not None and floor.value == 5


def test_an_endpoint_unused_for_a_list_ttl_is_no_longer_watched_unless_in_flight() -> None:
    dl = watch()
    dl.observe(E, 5, 0.0)
    vouched(dl, 5, 0.0)
    for now in (30.0, 60.0, 90.0):
        vouched(dl, 5, now)
    in_flight = dl.check(LIST_TTL_S + 1, in_flight={E})
    assert list(in_flight.floors) == [E]
    assert dl.check(LIST_TTL_S + 2).floors == {}
    # used again later: a new life, not compared until a check vouches for it
    assert dl.floor(E, LIST_TTL_S + 3) is None


def test_a_declaration_forgets_the_floors_and_keeps_the_lives() -> None:
    dl = watch()
    dl.observe(E, 5, 0.0)
    vouched(dl, 5, 0.0)
    life = dl.life(E, 1.0)
    before = dl.floor(E, 1.0)
    assert dl.declare("test") == 1
    # a reading sent before the declaration says nothing more
    assert dl.read(E, before, 1, 1.0) is None
    floor = dl.floor(E, 1.0)
    assert floor is not None and (floor.value, floor.life, floor.epoch) == (1, life, 1)
