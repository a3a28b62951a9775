"""DataLossWatch's enqueue counters: refreshed by every check, compared only while vouched for,
a new life when the vouching lapsed, and no longer watched once unused for a list TTL."""

from __future__ import annotations

import logging

import pytest
from redis.crc import key_slot
from redis.exceptions import ResponseError

from prq.core.config import QueueSettings
from prq.core.keys import KeySchema
from prq.node.data_loss.checks import UNJUDGED_WARN, Check, Loss
from prq.node.data_loss.scopes import Layout
from prq.node.data_loss.watch import DataLossWatch
from prq.protocol.effects import Reply
from prq.protocol.flows.context import Context

#: A list TTL of 100 s: a check's refresh vouches for a counter 50 s from when it was sent.
LIST_TTL_S = 100.0
VOUCHED_S = 50.0
E = "poll://e"


def watch() -> DataLossWatch:
    settings = QueueSettings(list_ttl_s=LIST_TTL_S, data_loss_check_interval_s=1.0)
    return DataLossWatch(Context(KeySchema("prq"), settings, "node"))


def seq_key(dl: DataLossWatch, endpoint: str = E) -> str:
    return dl.ctx.keys.endpoint(endpoint).sequence


def answer(check: Check, *counters: tuple[int, bool], gone: str = "") -> list[Reply]:
    """The replies Redis gives: each canary stepped (but the one named `gone`: 0), then per
    endpoint (value, key was there)."""
    replies: list[Reply] = [
        0 if key == gone else 1 if last is None else last + 1 for key, last in check.canaries
    ]
    for value, present in counters:
        replies += [str(value).encode() if present else None, int(present)]
    return replies


def vouched(dl: DataLossWatch, value: int, now: float) -> None:
    """A check at `now` finds the counter at `value` and refreshes it."""
    check = dl.check(now)
    assert dl.settle(check, answer(check, (value, True)), now) is None


def test_a_check_reads_and_refreshes_the_counter_of_every_endpoint_it_compares() -> None:
    dl = watch()
    dl.observe(E, 3, 0.0, dl.epoch)
    calls = [call.args for call in dl.check(0.0).calls[1:]]
    assert calls == [("GET", seq_key(dl)), ("PEXPIRE", seq_key(dl), int(LIST_TTL_S * 1000))]


def test_a_new_endpoint_brings_a_check_at_once() -> None:
    dl = watch()
    woken: list[bool] = []
    dl.wake = lambda: woken.append(True)
    dl.check(0.0)
    assert not dl.check_due(0.5)
    dl.observe(E, 1, 0.5, dl.epoch)
    assert dl.check_due(0.5)
    assert woken == [True]
    dl.observe(E, 2, 0.6, dl.epoch)  # known already: no more
    assert woken == [True]


def test_a_floor_is_compared_only_once_a_check_refreshed_its_counter() -> None:
    dl = watch()
    dl.observe(E, 5, 0.0, dl.epoch)
    assert dl.floor(E, 0.0) is None
    first = dl.check(0.0)
    assert first.floors == {E: None}
    assert dl.settle(first, answer(first, (5, True)), 0.0) is None
    floor = dl.floor(E, 1.0)
    assert floor is not None and floor.value == 5


def test_a_counter_below_a_vouched_floor_is_data_loss() -> None:
    dl = watch()
    dl.observe(E, 5, 0.0, dl.epoch)
    vouched(dl, 5, 0.0)
    check = dl.check(1.0)
    assert dl.settle(check, answer(check, (2, True)), 1.0) == Loss(
        "enqueue counter of 'poll://e' went back from 5 to 2", readings={E: 2}
    )
    # and a take's reading, the same
    floor = dl.floor(E, 2.0)
    assert (
        dl.read(E, floor, 1, 2.0, dl.epoch) == "enqueue counter of 'poll://e' went back from 5 to 1"
    )


def test_a_counter_gone_once_the_vouching_lapsed_is_no_loss_and_starts_a_new_life() -> None:
    # Given a counter vouched for until 50 s (a check sent at 0 s refreshed it)
    dl = watch()
    dl.observe(E, 5, 0.0, dl.epoch)
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
    dl.observe(E, 5, 0.0, dl.epoch)
    vouched(dl, 5, 0.0)
    floor = dl.floor(E, VOUCHED_S - 1)
    assert floor is not None
    assert dl.read(E, floor, 1, VOUCHED_S + 1, dl.epoch) is None
    assert dl.epoch == 0


def test_each_check_keeps_the_counter_vouched_for() -> None:
    dl = watch()
    dl.observe(E, 5, 0.0, dl.epoch)
    life = dl.life(E, 0.0)
    for now in (0.0, 30.0, 60.0, 90.0):  # each well within the 50 s the one before vouched
        vouched(dl, 5, now)
    assert dl.life(E, 95.0) == life
    floor = dl.floor(E, 95.0)
    assert floor is not None and floor.value == 5


def test_an_endpoint_unused_for_a_list_ttl_is_no_longer_watched_unless_in_flight() -> None:
    dl = watch()
    dl.observe(E, 5, 0.0, dl.epoch)
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
    dl.observe(E, 5, 0.0, dl.epoch)
    vouched(dl, 5, 0.0)
    life = dl.life(E, 1.0)
    before = dl.floor(E, 1.0)
    assert dl.declare("test") == 1
    # a reading sent before the declaration says nothing more, and sets no floor
    assert dl.read(E, before, 9, 1.0, 0) is None
    floor = dl.floor(E, 1.0)
    assert floor is not None and (floor.value, floor.life, floor.epoch) == (0, life, 1)
    # one sent after it does
    assert dl.read(E, floor, 1, 1.0, 1) is None
    floor = dl.floor(E, 1.0)
    assert floor is not None and (floor.value, floor.life, floor.epoch) == (1, life, 1)


@pytest.mark.parametrize("first_reading", ["take", "check"])
def test_the_first_reading_after_a_declaration_marks_the_ghosts(first_reading: str) -> None:
    # Given a counter at 5, then a declaration (a stale replica keeps requests 1-3 queued)
    dl = watch()
    dl.observe(E, 5, 0.0, dl.epoch)
    vouched(dl, 5, 0.0)
    assert dl.ghosts_up_to(E) == 0
    dl.declare("test")
    # When the first reading after it finds the counter at 4 (one request queued since)
    if first_reading == "take":
        assert dl.read(E, None, 4, 1.0, dl.epoch) is None
    else:
        check = dl.check(1.0)
        assert dl.settle(check, answer(check, (4, True)), 1.0) is None
    # Then requests numbered up to 4 are ghosts, and later readings move that no more
    assert dl.ghosts_up_to(E) == 4
    assert dl.read(E, None, 9, 2.0, dl.epoch) is None
    vouched(dl, 9, 2.0)
    assert dl.ghosts_up_to(E) == 4
    # And a new life of the counter (its numbers start again) has none
    dl.floor(E, 2.0 + VOUCHED_S)
    assert dl.ghosts_up_to(E) == 0


@pytest.mark.parametrize("stale_reading", ["take", "check"])
def test_a_reading_sent_before_the_declaration_marks_no_ghosts(stale_reading: str) -> None:
    # Given a counter at 5, a check sent then (it reads 5), and a declaration (the shard was
    # flushed: its counter starts again)
    dl = watch()
    dl.observe(E, 5, 0.0, dl.epoch)
    vouched(dl, 5, 0.0)
    sent_before = dl.check(1.0)
    epoch_before = dl.epoch
    dl.declare("test")

    # When the reading sent before the declaration comes back after it, showing 5
    if stale_reading == "take":
        assert dl.read(E, None, 5, 1.0, epoch_before) is None
        # (that take's own items are judged by its own reading: ghosts up to 5)
        assert dl.ghosts_for_take(E, 5) == 5
    else:
        assert dl.settle(sent_before, answer(sent_before, (5, True)), 1.0) is None

    # Then it marks nothing: requests queued after the loss (numbered from 1 again) are no
    # ghosts, once a reading sent after the declaration finds the counter at 1
    assert dl.ghosts_up_to(E) == 0
    assert dl.read(E, None, 1, 2.0, dl.epoch) is None
    assert dl.ghosts_up_to(E) == 1  # (what the flushed shard numbered before that reading)
    assert dl.ghosts_for_take(E, 3) == 1  # a later take's items above it run


def test_the_check_that_saw_a_loss_at_its_canary_marks_the_ghosts_with_its_own_readings() -> None:
    # Given one server, a node watching two endpoints whose counters it knows
    dl = watch()
    other = "poll://other"
    for endpoint in (E, other):
        dl.observe(endpoint, 5, 0.0, dl.epoch)
    vouched_both = dl.check(0.0)
    assert dl.settle(vouched_both, answer(vouched_both, (5, True), (5, True)), 0.0) is None
    # When a check finds its canary gone (Redis flushed: the counters read behind it, on the
    # same connection, ran after the flush: 0 and 2, the other endpoint queued two since)
    check = dl.check(1.0)
    loss = dl.settle(check, answer(check, (0, False), (2, True), gone=dl.canary_key), 1.0)
    assert loss == Loss("canary gone", readings={E: 0, other: 2})
    dl.declare(loss.reason, loss.slots, loss.readings)
    # Then those readings bound the ghosts at once: what is queued after them runs, even when
    # a take sent meanwhile (in the new epoch) comes back before any later reading
    assert (dl.ghosts_up_to(E), dl.ghosts_up_to(other)) == (0, 2)
    assert dl.ghosts_for_take(E, 1) == 0
    assert dl.ghosts_for_take(other, 3) == 2
    assert dl.read(other, None, 3, 1.5, dl.epoch) is None
    assert dl.ghosts_up_to(other) == 2


def test_a_check_whose_counter_went_back_marks_the_ghosts_from_that_counter_on() -> None:
    # Given one server and three endpoints, read in this order by every check
    dl = watch()
    first, middle, last = "poll://a", "poll://b", "poll://c"
    for endpoint in (first, middle, last):
        dl.observe(endpoint, 5, 0.0, dl.epoch)
    known = dl.check(0.0)
    dl.settle(known, answer(known, (5, True), (5, True), (5, True)), 0.0)
    # When the middle one's counter went back (a flush by another client may have come
    # between the first reading and the middle one: the first may show Redis before it)
    check = dl.check(1.0)
    assert list(check.floors) == [first, middle, last]
    loss = dl.settle(check, answer(check, (5, True), (1, True), (0, False)), 1.0)
    # Then the middle reading and those behind it bound the ghosts; the first waits for a
    # reading sent after the declaration
    assert loss is not None and loss.readings == {middle: 1, last: 0}
    dl.declare(loss.reason, loss.slots, loss.readings)
    assert dl.ghosts_for_take(middle, 4) == 1
    assert dl.ghosts_for_take(first, 4) == 4  # (a take's own reading, until one comes back)
    vouched_first = dl.check(2.0)
    dl.settle(vouched_first, answer(vouched_first, (2, True), (4, True), (0, True)), 2.0)
    assert dl.ghosts_up_to(first) == 2


def test_a_check_reply_that_is_no_reading_bounds_no_ghosts() -> None:
    dl = watch()
    dl.observe(E, 5, 0.0, dl.epoch)
    vouched(dl, 5, 0.0)
    check = dl.check(1.0)
    replies = answer(check, (0, True), gone=dl.canary_key)
    replies[1] = ResponseError("LOADING Redis is loading the dataset in memory")
    loss = dl.settle(check, replies, 1.0)
    assert loss is not None and loss.readings == {}


# On a cluster: a canary on every master, and a loss scoped to the master that lost it.

#: Three masters of a cluster, as prq.transport.connectors.shard_layout gives them.
THREE: dict[str, list[int]] = {
    "m1": list(range(0, 5461)),
    "m2": list(range(5461, 10923)),
    "m3": list(range(10923, 16384)),
}


def cluster_watch(layout: list[dict[str, list[int]]]) -> DataLossWatch:
    """A watch whose cluster layout is `layout[0]` (the test changes it in place)."""
    settings = QueueSettings(list_ttl_s=LIST_TTL_S, data_loss_check_interval_s=1.0)
    return DataLossWatch(Context(KeySchema("prq"), settings, "node"), lambda: layout[0])


def endpoint_on(dl: DataLossWatch, master: str, layout: Layout) -> str:
    """An endpoint whose keys live on `master`."""
    assert layout is not None
    for n in range(1000):
        endpoint = f"poll://e{n}"
        if key_slot(seq_key(dl, endpoint).encode()) in layout[master]:
            return endpoint
    raise AssertionError("no endpoint found")


def owner(layout: Layout, key: str) -> str:
    assert layout is not None
    return next(m for m, slots in layout.items() if key_slot(key.encode()) in slots)


def test_a_node_keeps_a_canary_on_every_master() -> None:
    layout = [THREE]
    dl = cluster_watch(layout)
    check = dl.check(0.0)
    keys = [key for key, _ in check.canaries]
    assert sorted(owner(THREE, key) for key in keys) == ["m1", "m2", "m3"]
    assert dl.canary_key in keys  # the one-server name stays the first
    assert dl.settle(check, answer(check), 0.0) is None
    assert [last for _, last in dl.check(1.0).canaries] == [1, 1, 1]


def test_a_canary_gone_on_one_master_is_a_loss_of_that_masters_slots_only() -> None:
    # Given a node watching endpoints on two masters, its canaries known
    layout = [THREE]
    dl = cluster_watch(layout)
    on_1, on_2 = endpoint_on(dl, "m1", THREE), endpoint_on(dl, "m2", THREE)
    for endpoint in (on_1, on_2):
        dl.observe(endpoint, 5, 0.0, dl.epoch)
    first = dl.check(0.0)
    dl.settle(first, answer(first, (5, True), (5, True)), 0.0)
    before_1, before_2 = dl.epoch_of(on_1), dl.epoch_of(on_2)
    # When m2's canary is gone (m2 flushed)
    check = dl.check(1.0)
    gone = next(key for key, _ in check.canaries if owner(THREE, key) == "m2")
    loss = dl.settle(check, answer(check, (5, True), (5, True), gone=gone), 1.0)
    # Then the loss covers m2's slots, and its declaration moves only m2's endpoints on
    assert loss == Loss("canary gone", frozenset(THREE["m2"]))
    dl.declare(loss.reason, loss.slots)
    assert dl.epoch_of(on_1) == before_1
    assert dl.epoch_of(on_2) != before_2
    assert dl.covers(on_2, loss.slots) and not dl.covers(on_1, loss.slots)
    # And only m2's canary is written afresh; m1's floor is still compared
    lasts = {owner(THREE, key): last for key, last in dl.check(2.0).canaries}
    assert lasts == {"m1": 2, "m2": None, "m3": 2}
    floor = dl.floor(on_1, 2.0)
    assert floor is not None and floor.value == 5
    assert dl.floor(on_2, 2.0) is not None and dl.floor(on_2, 2.0).value == 0  # type: ignore[union-attr]


def test_a_counter_that_went_back_is_a_loss_of_its_masters_slots() -> None:
    layout = [THREE]
    dl = cluster_watch(layout)
    on_3 = endpoint_on(dl, "m3", THREE)
    dl.observe(on_3, 5, 0.0, dl.epoch)
    first = dl.check(0.0)
    dl.settle(first, answer(first, (5, True)), 0.0)
    check = dl.check(1.0)
    loss = dl.settle(check, answer(check, (2, True)), 1.0)
    assert loss is not None and loss.slots == frozenset(THREE["m3"])
    # (only the reading that went back surely ran after the loss on a cluster)
    assert loss.readings == {on_3: 2}


def test_on_a_cluster_a_check_that_saw_a_loss_at_a_canary_marks_no_ghosts_itself() -> None:
    # Given a node watching an endpoint on m2, its canaries known
    layout = [THREE]
    dl = cluster_watch(layout)
    on_2 = endpoint_on(dl, "m2", THREE)
    dl.observe(on_2, 5, 0.0, dl.epoch)
    first = dl.check(0.0)
    dl.settle(first, answer(first, (5, True)), 0.0)
    # When m2's canary is gone: the counter was read on m2 by another connection than the
    # canary's (or before a redirected canary was sent again), maybe before the flush
    check = dl.check(1.0)
    gone = next(key for key, _ in check.canaries if owner(THREE, key) == "m2")
    loss = dl.settle(check, answer(check, (5, True), gone=gone), 1.0)
    assert loss is not None and loss.readings == {}
    # Then the first reading sent after the declaration bounds the ghosts
    dl.declare(loss.reason, loss.slots, loss.readings)
    assert dl.ghosts_for_take(on_2, 2) == 2
    assert dl.read(on_2, None, 2, 1.5, dl.epoch) is None
    assert dl.ghosts_up_to(on_2) == 2


def test_a_failover_keeps_the_canary_and_a_stale_replica_shows_as_a_rollback() -> None:
    # Given canaries known on every master
    layout = [THREE]
    dl = cluster_watch(layout)
    first = dl.check(0.0)
    dl.settle(first, answer(first), 0.0)
    keys = [key for key, _ in first.canaries]
    # When m1 fails over to its replica r1 (a new name, the same slots)
    layout[0] = {"r1" if m == "m1" else m: slots for m, slots in THREE.items()}
    check = dl.check(1.0)
    # Then the same canaries are stepped, their last values expected
    assert [key for key, _ in check.canaries] == keys
    assert all(last == 1 for _, last in check.canaries)
    # And a replica that missed the last step is a rollback of r1's slots
    replies = answer(check)
    stale = next(i for i, key in enumerate(keys) if owner(layout[0], key) == "r1")
    replies[stale] = 1  # expected 2
    loss = dl.settle(check, replies, 1.0)
    assert loss is not None and loss.slots == frozenset(THREE["m1"])


def test_a_master_that_lost_its_canarys_slot_gets_a_new_canary() -> None:
    layout = [THREE]
    dl = cluster_watch(layout)
    first = dl.check(0.0)
    dl.settle(first, answer(first), 0.0)
    on_m2 = next(key for key, _ in first.canaries if owner(THREE, key) == "m2")
    # When the slot of m2's canary migrates to m3
    moved = key_slot(on_m2.encode())
    layout[0] = {
        "m1": THREE["m1"],
        "m2": [s for s in THREE["m2"] if s != moved],
        "m3": [moved, *THREE["m3"]],
    }
    check = dl.check(1.0)
    # Then m2 gets a fresh canary, m3 keeps its own (the older), and the moved one is dropped
    placed = {owner(layout[0], key): (key, last) for key, last in check.canaries}
    assert sorted(placed) == ["m1", "m2", "m3"]
    assert placed["m2"][1] is None and placed["m2"][0] != on_m2
    assert placed["m3"][1] == 1 and placed["m3"][0] != on_m2
    assert dl.settle(check, answer(check), 1.0) is None


def test_checks_asked_for_while_one_steps_the_canary_step_none_and_see_no_loss() -> None:
    # Given a node whose canary reads 1
    dl = watch()
    first = dl.check(0.0)
    assert dl.settle(first, answer(first), 0.0) is None
    # When a check is on its way and another is asked for meanwhile (a call found its
    # request gone, say)
    on_its_way = dl.check(1.0)
    meanwhile = dl.check(1.1)
    # Then only the first steps the canary, and neither sees a loss, whichever comes back
    # first (Redis steps it from 1 to 2 once)
    assert on_its_way.canaries == [(dl.canary_key, 1)]
    assert meanwhile.canaries == []
    assert dl.settle(meanwhile, answer(meanwhile), 1.2) is None
    assert dl.settle(on_its_way, [2], 1.2) is None
    # And the next check steps it again, expecting 3
    after = dl.check(2.0)
    assert after.canaries == [(dl.canary_key, 2)]
    assert dl.settle(after, [3], 2.0) is None


def test_a_check_that_got_no_reply_keeps_no_later_one_from_stepping_the_canary() -> None:
    dl = watch()
    failed = dl.check(0.0)
    dl.forget(failed)  # its round trip failed
    never_back = dl.check(0.1)  # stepping, though an earlier check did not come back
    assert never_back.canaries
    # (its reply never comes, and nothing says so)
    assert dl.check(0.2).canaries == []
    assert dl.check(0.1 + dl.canary_ttl_s()).canaries  # no longer waited for


def test_checks_whose_canary_replies_are_not_counts_warn_once_they_come_in_a_row(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dl = watch()
    first = dl.check(0.0)
    assert dl.settle(first, answer(first), 0.0) is None
    caplog.set_level(logging.INFO, logger="prq.node.data_loss")
    # When checks come back with an error in place of a canary's count, several in a row
    for n in range(1, UNJUDGED_WARN + 1):
        check = dl.check(float(n))
        assert dl.settle(check, [ResponseError("CLUSTERDOWN")], float(n)) is None
        warned = [r for r in caplog.records if "not judged" in r.getMessage()]
        # Then the node warns once they are UNJUDGED_WARN in a row, not before
        assert len(warned) == (1 if n == UNJUDGED_WARN else 0)
        assert all(r.levelno == logging.WARNING for r in warned)
    # And says so when a check is judged again
    check = dl.check(10.0)
    assert dl.settle(check, [2], 10.0) is None
    assert any("judged again" in r.getMessage() for r in caplog.records)
    assert dl.unjudged == 0


@pytest.mark.parametrize("late_reading", ["take", "enqueue"])
def test_a_reading_sent_before_the_declaration_sets_no_floor_after_it(late_reading: str) -> None:
    # Given a counter at 5,000 vouched for, then data loss declared (the shard was flushed: the
    # counter starts again from 0)
    dl = watch()
    dl.observe(E, 5_000, 0.0, dl.epoch)
    vouched(dl, 5_000, 0.0)
    epoch_before = dl.epoch
    dl.declare("test")
    # When a reading sent before the declaration comes back after it, showing 5,000 (a take
    # or an enqueue that ran before the flush, its reply handled once the loss was declared)
    if late_reading == "take":
        assert dl.read(E, None, 5_000, 1.0, epoch_before) is None
    else:
        dl.observe(E, 5_000, 1.0, epoch_before)
    # Then the next check, which finds the counter at 3 (three requests since the flush), sees
    # no second loss: the old value belongs to the Redis before the loss
    check = dl.check(2.0)
    assert dl.settle(check, answer(check, (3, True)), 2.0) is None
    assert dl.events == 1
    # and readings sent after the declaration are compared as before
    assert dl.read(E, dl.floor(E, 2.5), 4, 2.5, dl.epoch) is None
    check = dl.check(3.0)
    assert isinstance(dl.settle(check, answer(check, (2, True)), 3.0), Loss)
