"""DataLossWatch: the signs of a loss and the fence each sets, what a declaration does, and the
rule itself tried against a model of a Redis that is flushed, restarted and rolled back.

The replies are written here as Redis gives them (canary.lua's {value, clock}, a GET of an
endpoint's last sequence number); tests/integration/test_data_loss.py runs the same on a real
Redis.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from redis.crc import key_slot
from redis.exceptions import ResponseError

from prq.core.config import QueueSettings
from prq.core.keys import KeySchema
from prq.node.data_loss.checks import UNJUDGED_WARN, Check
from prq.node.data_loss.scopes import Layout, Loss
from prq.node.data_loss.watch import DataLossWatch
from prq.protocol.effects import Reply
from prq.protocol.flows.context import Context

LIST_TTL_S = 100.0
E = "poll://e"
#: A server clock, µs (sequence numbers are at least it).
T0 = 1_800_000_000_000_000


def watch(layout: list[Layout] | None = None) -> DataLossWatch:
    settings = QueueSettings(list_ttl_s=LIST_TTL_S, data_loss_check_interval_s=1.0)
    ctx = Context(KeySchema("prq"), settings, "node")
    if layout is None:
        return DataLossWatch(ctx)
    return DataLossWatch(ctx, lambda: layout[0])


def numbers_key(dl: DataLossWatch, endpoint: str = E) -> str:
    return dl.ctx.keys.endpoint(endpoint).numbers


def following(check: Check, i: int) -> int:
    """The value the check's canary step number `i` writes (canary.lua's ARGV[3])."""
    value = check.calls[i].args[-1]
    assert isinstance(value, int)
    return value


def step(current: int, expected: int | None, writes: int) -> int:
    """canary.lua: the canary's value after a step that expects `expected` (None: anything)
    and writes `writes`, when it found `current`."""
    return writes if expected is None or current == expected else current


def answer(
    check: Check, *numbers: int | None, clock: int = T0, gone: str = "", back: str = ""
) -> list[Reply]:
    """The replies Redis gives: each canary stepped (but the one named `gone`: 0, and `back`:
    an older value) at `clock`, then per endpoint its last sequence number (None: no key)."""
    replies: list[Reply] = []
    for i, (key, _) in enumerate(check.canaries):
        value = following(check, i)
        if key == gone:
            value = 0
        elif key == back:
            value -= 2
        replies.append([value, clock])
    replies += [None if n is None else str(n).encode() for n in numbers]
    return replies


def settled(dl: DataLossWatch, now: float, *numbers: int | None, clock: int = T0) -> None:
    """A check at `now` that finds everything as it was."""
    check = dl.check(now)
    assert dl.settle(check, answer(check, *numbers, clock=clock), now) is None


def test_a_check_steps_the_canary_and_reads_the_numbers_of_every_endpoint_in_use() -> None:
    dl = watch()
    assert dl.enqueued(E, dl.floor(E, 0.0), 0, T0 + 3, 0.0) is None
    check = dl.check(0.0)
    assert check.canaries == [(dl.canary_key, None)]
    assert [call.args for call in check.calls[1:]] == [("GET", numbers_key(dl))]
    assert dl.settle(check, answer(check, T0 + 3), 0.0) is None
    assert dl.floor(E, 0.5).value == T0 + 3


def test_numbers_below_the_floor_are_a_rollback_fenced_at_the_floor() -> None:
    # Given a node that read T0 + 9 on E
    dl = watch()
    settled(dl, 0.0)
    dl.enqueued(E, dl.floor(E, 0.0), 0, T0 + 9, 0.0)
    # When a take reads T0 + 4 (Redis went back to before T0 + 9 was given)
    loss = dl.read(E, dl.floor(E, 1.0), T0 + 4, 1.0)
    # Then it is a loss of all of Redis, fenced at the floor
    assert loss == Loss(
        f"sequence numbers of {E!r} went back from {T0 + 9} to {T0 + 4}", None, T0 + 9
    )


def test_a_counter_that_started_again_above_the_floor_is_no_loss() -> None:
    # (it expired while the endpoint was idle, or was flushed: the next number is the clock)
    dl = watch()
    settled(dl, 0.0)
    dl.enqueued(E, dl.floor(E, 0.0), 0, T0 + 9, 0.0)
    assert dl.read(E, dl.floor(E, 1.0), T0 + 86_400_000_000, 1.0) is None
    assert dl.events == 0


def test_a_counter_gone_is_no_loss_but_a_take_that_finds_it_gone_checks_at_once() -> None:
    dl = watch()
    woken: list[bool] = []
    dl.wake = lambda: woken.append(True)
    settled(dl, 0.0)
    dl.enqueued(E, dl.floor(E, 0.0), 0, T0 + 9, 0.0)
    assert not dl.check_due(0.5)
    # When a take finds no counter (it expired, or a flush took it)
    assert dl.read(E, dl.floor(E, 0.5), 0, 0.5) is None
    # Then a check is due at once, and the floor stays (a rollback after it reads below it)
    assert dl.check_due(0.5) and woken
    assert dl.floor(E, 0.5).value == T0 + 9
    # And the check that finds it gone too asks for no other, nor does the next take
    check = dl.check(0.5)
    assert dl.settle(check, answer(check, None), 0.5) is None
    assert not dl.check_due(0.6)
    assert dl.read(E, dl.floor(E, 0.6), 0, 0.6) is None
    assert not dl.check_due(0.6)


def test_a_rollback_after_the_counter_was_found_gone_reads_below_the_floor() -> None:
    # Given a node that read numbers up to T0 + 9, then found the counter gone (a flush,
    # before the check it asked for came)
    dl = watch()
    settled(dl, 0.0)
    dl.enqueued(E, dl.floor(E, 0.0), 0, T0 + 9, 0.0)
    assert dl.read(E, dl.floor(E, 0.5), 0, 0.5) is None
    # When Redis comes back from an older snapshot, its counter at T0 + 5
    loss = dl.read(E, dl.floor(E, 0.6), T0 + 5, 0.6)
    # Then the take that reads it declares the rollback, fenced at the floor: the snapshot's
    # requests, run already, are refused (before, the floor was forgotten and they ran again)
    assert loss is not None and loss.fence == T0 + 9


def test_an_enqueue_whose_number_before_is_below_the_floor_is_a_rollback() -> None:
    dl = watch()
    settled(dl, 0.0)
    dl.enqueued(E, dl.floor(E, 0.0), 0, T0 + 9, 0.0)
    # (an enqueue's own number jumps to the clock; the number before it tells)
    loss = dl.enqueued(E, dl.floor(E, 1.0), T0 + 5, T0 + 2_000_000, 1.0)
    assert loss is not None and loss.fence == T0 + 9


def test_an_enqueue_that_finds_no_counter_checks_at_once() -> None:
    dl = watch()
    settled(dl, 0.0)
    dl.enqueued(E, dl.floor(E, 0.0), 0, T0 + 9, 0.0)
    assert dl.enqueued(E, dl.floor(E, 1.0), 0, T0 + 2_000_000, 1.0) is None
    assert dl.check_due(1.0)
    assert dl.floor(E, 1.0).value == T0 + 2_000_000


def test_a_canary_gone_is_a_loss_fenced_at_the_clock_of_its_last_good_step() -> None:
    dl = watch()
    settled(dl, 0.0, clock=T0)
    settled(dl, 1.0, clock=T0 + 1_000_000)
    check = dl.check(2.0)
    loss = dl.settle(check, answer(check, clock=T0 + 2_000_000, gone=dl.canary_key), 2.0)
    assert loss == Loss("canary gone", None, T0 + 1_000_000, by_canary=True)


def test_a_canary_rolled_back_is_a_loss_fenced_at_the_clock_of_its_last_good_step() -> None:
    dl = watch()
    for n in range(3):
        settled(dl, float(n), clock=T0 + n * 1_000_000)
    check = dl.check(3.0)
    loss = dl.settle(check, answer(check, clock=T0 + 3_000_000, back=dl.canary_key), 3.0)
    assert loss is not None and "rolled back" in loss.reason
    assert (loss.slots, loss.fence) == (None, T0 + 2_000_000)


def test_a_declaration_raises_the_fence_and_forgets_the_floors() -> None:
    dl = watch()
    settled(dl, 0.0)
    dl.enqueued(E, dl.floor(E, 0.0), 0, T0 + 9, 0.0)
    canary = dl.canary
    assert dl.declare(Loss("test", None, T0 + 9, by_canary=True)) == 1
    assert (dl.epoch_of(E), dl.fence_of(E), dl.floor(E, 1.0).value) == (1, T0 + 9, 0)
    check = dl.check(1.0)
    assert check.canaries == [(dl.canary_key, canary)]  # (stepped on as it was read)
    assert dl.settle(check, answer(check, T0 + 9), 1.0) is None
    # A loss shown by another sign leaves the canary as it was before it: written afresh
    dl.declare(Loss("test", None, T0 + 9))
    assert dl.check(2.0).canaries == [(dl.canary_key, None)]
    # A later loss with an older fence does not lower it (the fence only rises)
    dl.declare(Loss("test", None, T0 + 5))
    assert (dl.epoch_of(E), dl.fence_of(E)) == (3, T0 + 9)


@pytest.mark.parametrize("late_reading", ["take", "enqueue", "check"])
def test_a_reading_sent_before_a_declaration_says_nothing_after_it(late_reading: str) -> None:
    # Given a node that read T0 + 9, then a declared loss (a flush)
    dl = watch()
    settled(dl, 0.0)
    dl.enqueued(E, dl.floor(E, 0.0), 0, T0 + 9, 0.0)
    floor_before = dl.floor(E, 0.5)
    check_before = dl.check(0.5)
    dl.declare(Loss("test", None, T0))
    # When a reading sent before the declaration comes back, showing what Redis held then
    if late_reading == "take":
        assert dl.read(E, floor_before, T0 + 9, 1.0) is None
    elif late_reading == "enqueue":
        assert dl.enqueued(E, floor_before, T0 + 8, T0 + 9, 1.0) is None
    else:
        assert dl.settle(check_before, answer(check_before, T0 + 9), 1.0) is None
    # Then it set no floor: a reading of the new Redis, lower, is no second loss
    assert dl.floor(E, 1.0).value == 0
    assert dl.read(E, dl.floor(E, 1.5), T0 + 3, 1.5) is None
    assert dl.events == 1


def test_a_call_survives_a_declaration_if_its_request_is_numbered_above_the_fence() -> None:
    dl = watch()
    before = dl.mark(E, 0.0)
    unsent = dl.mark(E, 0.0)
    known = dl.mark(E, 0.0)
    after = dl.mark(E, 0.0)
    before.number, known.number = T0 + 1, 0
    dl.declare(Loss("test", None, T0 + 5))
    assert not dl.survives(before)  # queued before the loss: it may be gone, or a ghost
    assert not dl.survives(known)  # joined a request of unknown number
    assert dl.survives(unsent)  # judged once its enqueue answers
    unsent.number = T0 + 2
    assert not dl.survives(unsent)
    after.number = T0 + 6
    assert dl.survives(after)
    # and, judged once, it is judged again only by the next declaration
    dl.declare(Loss("test", None, T0 + 7))
    assert not dl.survives(after)


def test_a_take_sends_the_stamp_it_last_read_and_one_below_it_is_a_loss_fenced_there() -> None:
    dl = watch()
    first = dl.floor(E, 0.0)
    assert first.stamp == 0  # (none known: the take judges nothing)
    assert dl.stamped(E, first, T0 + 10, None) is None
    floor = dl.floor(E, 1.0)
    assert floor.stamp == T0 + 10
    # A stamp kept past half a list TTL (from the take that read it) may have expired: it is
    # not sent any more
    assert dl.floor(E, LIST_TTL_S / 2 - 0.1).stamp == T0 + 10
    assert dl.floor(E, LIST_TTL_S / 2 + 0.1).stamp == 0
    # A stamp lower than that (a rollback behind the take), or gone (a flush), is a loss whose
    # fence is the stamp sent: a server time before it; the take left the stamp as it found
    # it, and the node forgets its own, so that its next take sends none (and writes anew)
    for held in (T0 + 4, 0):
        loss = dl.stamped(E, floor, held, held)
        assert loss is not None and loss.fence == T0 + 10 and loss.slots is None
        assert dl.floor(E, 2.0).stamp == 0


def test_a_stamp_learned_while_its_take_waits_on_is_sent_by_the_nodes_other_takes() -> None:
    # Given a node's take that wrote a stamp and found none below, its flow waiting on
    dl = watch()
    dl.learned(E, dl.floor(E, 0.0), T0 + 10)
    # Then another take of the node, sent meanwhile, carries that stamp
    assert dl.floor(E, 0.5).stamp == T0 + 10
    # and a lower one learned later does not lower it
    dl.learned(E, dl.floor(E, 0.6), T0 + 5)
    assert dl.floor(E, 0.7).stamp == T0 + 10


def test_a_stamp_that_went_back_after_another_sign_declared_its_loss_raises_that_fence() -> None:
    # Given a node whose take read a stamp, then declared a loss another sign showed, with a
    # fence below that stamp (a canary's last good step before the take)
    dl = watch()
    dl.stamped(E, dl.floor(E, 0.0), T0 + 10, None)
    floor = dl.floor(E, 1.0)
    dl.declare(Loss("canary gone", None, T0 + 5, by_canary=True))
    # When its next take finds the stamp gone: the same loss
    assert dl.stamped(E, floor, 0, 0) is None
    # Then it is not declared again, but its fence rises to the stamp, in the same epoch
    assert (dl.events, dl.epoch_of(E), dl.fence_of(E)) == (1, 1, T0 + 10)
    # And once a take wrote a stamp afresh, a later take that finds it gone is a new loss
    assert dl.floor(E, 2.0).stamp == 0
    dl.stamped(E, dl.floor(E, 2.0), T0 + 30, None)
    again = dl.floor(E, 2.5)
    assert again.stamp == T0 + 30
    loss = dl.stamped(E, again, 0, 0)
    assert loss is not None and loss.fence == T0 + 30
    # (one the fence covers already says nothing more)
    dl.declare(Loss("test", None, T0 + 50))
    dl.stamped(E, dl.floor(E, 3.0), T0 + 45, None)
    assert dl.stamped(E, dl.floor(E, 3.5), T0 + 1, T0 + 1) is None


def test_a_hand_out_taken_again_is_fenced_at_the_floor_or_its_own_number() -> None:
    dl = watch()
    assert dl.handed_again(E, T0 + 4) == T0 + 4
    dl.enqueued(E, dl.floor(E, 0.0), 0, T0 + 9, 0.0)
    assert dl.handed_again(E, T0 + 4) == T0 + 9


def test_an_endpoint_unused_for_a_list_ttl_is_no_longer_read_unless_in_flight() -> None:
    dl = watch()
    dl.enqueued(E, dl.floor(E, 0.0), 0, T0 + 1, 0.0)
    other = "poll://other"
    dl.enqueued(other, dl.floor(other, 0.0), 0, T0 + 1, 0.0)
    check = dl.check(LIST_TTL_S + 1, in_flight={other})
    assert list(check.floors) == [other]


def test_checks_asked_for_while_one_steps_the_canary_step_none_and_see_no_loss() -> None:
    dl = watch()
    settled(dl, 0.0)
    on_its_way = dl.check(1.0)
    meanwhile = dl.check(1.1)  # (a call found its request gone, say)
    assert on_its_way.canaries == [(dl.canary_key, dl.canary)]
    assert meanwhile.canaries == []
    assert dl.settle(meanwhile, answer(meanwhile), 1.2) is None
    assert dl.settle(on_its_way, answer(on_its_way), 1.2) is None
    after = dl.check(2.0)
    assert after.canaries == [(dl.canary_key, on_its_way.canaries[0][1] + 1)]  # type: ignore[operator]
    assert dl.settle(after, answer(after), 2.0) is None


def test_a_check_that_got_no_reply_keeps_no_later_one_from_stepping_the_canary() -> None:
    dl = watch()
    failed = dl.check(0.0)
    dl.forget(failed)
    never_back = dl.check(0.1)
    assert never_back.canaries
    assert dl.check(0.2).canaries == []
    assert dl.check(0.1 + dl.canary_ttl_s()).canaries  # no longer waited for


def test_checks_whose_canary_replies_are_not_steps_warn_once_they_come_in_a_row(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dl = watch()
    settled(dl, 0.0)
    caplog.set_level(logging.INFO, logger="prq.node.data_loss")
    for n in range(1, UNJUDGED_WARN + 1):
        check = dl.check(float(n))
        assert dl.settle(check, [ResponseError("CLUSTERDOWN")], float(n)) is None
        warned = [r for r in caplog.records if "not judged" in r.getMessage()]
        assert len(warned) == (1 if n == UNJUDGED_WARN else 0)
    check = dl.check(10.0)
    assert dl.settle(check, answer(check), 10.0) is None
    assert any("judged again" in r.getMessage() for r in caplog.records)


def test_a_counter_that_is_not_a_number_is_read_as_none() -> None:
    dl = watch()
    settled(dl, 0.0)
    dl.enqueued(E, dl.floor(E, 0.0), 0, T0 + 9, 0.0)
    check = dl.check(1.0)
    assert dl.settle(check, [*answer(check)[:1], b"garbage"], 1.0) is None
    assert dl.events == 0


# On a cluster: a canary on every master, and a loss scoped to the master that lost it.

#: Three masters of a cluster, as prq.transport.connectors.shard_layout gives them.
THREE: dict[str, list[int]] = {
    "m1": list(range(0, 5461)),
    "m2": list(range(5461, 10923)),
    "m3": list(range(10923, 16384)),
}


def endpoint_on(dl: DataLossWatch, master: str) -> str:
    """An endpoint whose keys live on `master` of THREE."""
    for n in range(1000):
        endpoint = f"poll://e{n}"
        if key_slot(numbers_key(dl, endpoint).encode()) in THREE[master]:
            return endpoint
    raise AssertionError("no endpoint found")


def owner(layout: Layout, key: str) -> str:
    assert layout is not None
    return next(m for m, slots in layout.items() if key_slot(key.encode()) in slots)


def test_a_node_keeps_a_canary_on_every_master() -> None:
    dl = watch([THREE])
    check = dl.check(0.0)
    keys = [key for key, _ in check.canaries]
    assert sorted(owner(THREE, key) for key in keys) == ["m1", "m2", "m3"]
    assert dl.canary_key in keys  # the one-server name stays the first
    assert dl.settle(check, answer(check), 0.0) is None
    fresh = [following(check, i) for i in range(3)]
    assert [last for _, last in dl.check(1.0).canaries] == fresh


def test_a_canary_gone_on_one_master_fences_that_masters_slots_only() -> None:
    dl = watch([THREE])
    on_1, on_2 = endpoint_on(dl, "m1"), endpoint_on(dl, "m2")
    for endpoint in (on_1, on_2):
        dl.enqueued(endpoint, dl.floor(endpoint, 0.0), 0, T0 + 5, 0.0)
    settled(dl, 0.0, T0 + 5, T0 + 5, clock=T0 + 10)
    check = dl.check(1.0)
    gone = next(key for key, _ in check.canaries if owner(THREE, key) == "m2")
    loss = dl.settle(check, answer(check, T0 + 5, T0 + 5, gone=gone), 1.0)
    assert loss == Loss("canary gone", frozenset(THREE["m2"]), T0 + 10, by_canary=True)
    dl.declare(loss)
    assert (dl.epoch_of(on_1), dl.fence_of(on_1)) == (0, 0)
    assert (dl.epoch_of(on_2), dl.fence_of(on_2)) == (1, T0 + 10)
    stepped = {owner(THREE, key): last for key, last in check.canaries}
    lasts = {owner(THREE, key): last for key, last in dl.check(2.0).canaries}
    # (m2's is stepped from what was read: it is gone, so the next step writes it afresh)
    assert lasts == {"m1": stepped["m1"] + 1, "m2": 0, "m3": stepped["m3"] + 1}  # type: ignore[operator]
    assert (dl.floor(on_1, 2.0).value, dl.floor(on_2, 2.0).value) == (T0 + 5, 0)


def test_numbers_that_went_back_on_one_master_fence_its_slots() -> None:
    dl = watch([THREE])
    on_3 = endpoint_on(dl, "m3")
    dl.enqueued(on_3, dl.floor(on_3, 0.0), 0, T0 + 5, 0.0)
    settled(dl, 0.0, T0 + 5)
    check = dl.check(1.0)
    loss = dl.settle(check, answer(check, T0 + 2), 1.0)
    assert loss is not None and loss.slots == frozenset(THREE["m3"]) and loss.fence == T0 + 5


def test_a_failover_keeps_the_canary_and_a_stale_replica_shows_as_a_rollback() -> None:
    layout: list[Layout] = [THREE]
    dl = watch(layout)
    first = dl.check(0.0)
    dl.settle(first, answer(first), 0.0)
    keys = [key for key, _ in first.canaries]
    layout[0] = {"r1" if m == "m1" else m: slots for m, slots in THREE.items()}
    check = dl.check(1.0)
    assert [key for key, _ in check.canaries] == keys
    assert [last for _, last in check.canaries] == [following(first, i) for i in range(3)]
    stale = next(key for key in keys if owner(layout[0], key) == "r1")
    loss = dl.settle(check, answer(check, back=stale), 1.0)
    assert loss is not None and loss.slots == frozenset(THREE["m1"])


def test_a_master_that_lost_its_canarys_slot_gets_a_new_canary() -> None:
    layout: list[Layout] = [THREE]
    dl = watch(layout)
    first = dl.check(0.0)
    dl.settle(first, answer(first), 0.0)
    on_m2 = next(key for key, _ in first.canaries if owner(THREE, key) == "m2")
    moved = key_slot(on_m2.encode())
    layout[0] = {
        "m1": THREE["m1"],
        "m2": [s for s in THREE["m2"] if s != moved],
        "m3": [moved, *THREE["m3"]],
    }
    check = dl.check(1.0)
    placed = {owner(layout[0], key): (key, last) for key, last in check.canaries}
    assert sorted(placed) == ["m1", "m2", "m3"]
    assert placed["m2"][1] is None and placed["m2"][0] != on_m2
    assert placed["m3"][1] is not None and placed["m3"][0] != on_m2
    assert dl.settle(check, answer(check), 1.0) is None


# The rule, against a model of one Redis server: whatever it goes through, a fence is above
# every request the lost data held and below every request queued after the loss.


@dataclass
class _Data:
    """What the modelled Redis holds: the last sequence number given (None: no key), the
    node's canary (None: gone), and the numbers of the requests it holds."""

    last: int | None = None
    canary: int | None = None
    requests: set[int] = field(default_factory=set)

    def copy(self) -> _Data:
        return _Data(self.last, self.canary, set(self.requests))


class RedisThatLosesData(RuleBasedStateMachine):
    """A server (a clock in µs, its data, the snapshots it may go back to) and one node's
    watch, driven by enqueues, takes and checks of the node, and by flushes, restarts empty,
    rollbacks and counter expiry."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = T0
        self.now = 0.0
        self.data = _Data()
        self.snapshots: list[_Data] = []
        #: Requests queued after the last loss: no fence may ever reach them.
        self.after_loss: set[int] = set()
        #: Requests taken (run) before: a rollback may bring them back.
        self.ran: set[int] = set()
        #: Requests that ran and came back with a rollback the canary shows, not fenced yet:
        #: the next declaration's fence must reach them.
        self.ghosts: set[int] = set()
        self.undeclared = False  # a loss came since the last declaration
        self.dl = watch()

    def _tick(self, us: int) -> None:
        self.clock += us
        self.now += us / 1_000_000

    @rule(count=st.integers(1, 50), gap=st.integers(0, 2_000_000))
    def enqueue(self, count: int, gap: int) -> None:
        self._tick(gap)
        before = self.data.last or 0
        first = max(before + 1, self.clock)
        self._tick(count)  # (at most one number a microsecond: none runs ahead of the clock)
        self.data.last = first + count - 1
        numbers = set(range(first, first + count))
        self.data.requests |= numbers
        self.after_loss |= numbers
        floor = self.dl.floor(E, self.now)
        self._declare(self.dl.enqueued(E, floor, before, first + count - 1, self.now))

    @rule(gap=st.integers(0, 2_000_000), count=st.integers(0, 20))
    def take(self, gap: int, count: int) -> None:
        self._tick(gap)
        floor = self.dl.floor(E, self.now)
        self._declare(self.dl.read(E, floor, self.data.last or 0, self.now))
        fence = self.dl.fence_of(E)
        taken = sorted(self.data.requests)[:count]
        self.data.requests -= set(taken)
        self.ran |= {n for n in taken if n > fence}  # (a ghost is refused: it does not run)

    @rule(gap=st.integers(0, 2_000_000))
    def check(self, gap: int) -> None:
        self._tick(gap)
        stale = self.now - self.dl.last_ok > self.dl.canary_ttl_s()
        check = self.dl.check(self.now)
        replies: list[Reply] = []
        for i, (_, last) in enumerate(check.canaries):
            current = step(self.data.canary or 0, last, following(check, i))
            self.data.canary = current or None
            replies.append([current, self.clock])
        replies += [
            None if self.data.last is None else b"%d" % self.data.last for _ in check.floors
        ]
        loss = self.dl.settle(check, replies, self.now)
        if loss is None and check.canaries:
            # a rollback behind the last step shows, unless the node was out of touch for
            # longer than a canary lives (its canary is then written afresh)
            assert not self.ghosts or stale
            self.ghosts = set()
        self._declare(loss)

    @rule()
    def snapshot(self) -> None:
        self.snapshots.append(self.data.copy())

    @rule(gap=st.integers(1, 2_000_000))
    def flush(self, gap: int) -> None:
        self._tick(gap)
        self.data = _Data()
        self.ghosts = set()
        self._lost()

    @rule()
    def counter_expires(self) -> None:
        self.data.last = None  # (an idle endpoint: its requests are long gone too)
        self.data.requests.clear()

    @precondition(lambda self: self.snapshots)
    @rule(which=st.integers(0, 100), gap=st.integers(1, 2_000_000))
    def roll_back(self, which: int, gap: int) -> None:
        self._tick(gap)
        self.data = self.snapshots[which % len(self.snapshots)].copy()
        # The next check surely shows it if the canary is not what the node expects (else it
        # went back to a moment after the canary's last step: only a reading may show it);
        # and its fence reaches what ran and was there before that step (a request queued
        # after it, between two losses, escapes: docs/design.md, "Data-loss detection")
        canary = self.dl.canaries[self.dl.canary_key]
        if canary.last is not None and (self.data.canary or 0) != canary.last:
            fence = self.dl.fence_of(E)  # (what is behind it is refused already)
            back = self.data.requests & self.ran
            self.ghosts = {n for n in back if fence < n <= canary.good}
        else:
            self.ghosts = set()
        self._lost()

    def _lost(self) -> None:
        self.after_loss = set()
        self.undeclared = True

    def _declare(self, loss: Loss | None) -> None:
        if loss is None:
            return
        assert self.undeclared, f"declared without a loss since the last: {loss}"
        self.undeclared = False
        self.dl.declare(loss)
        fence = self.dl.fence_of(E)
        assert all(ghost <= fence for ghost in self.ghosts)
        self.ghosts = set()

    @invariant()
    def nothing_queued_after_the_last_loss_is_fenced(self) -> None:
        fence = self.dl.fence_of(E)
        assert all(number > fence for number in self.after_loss)


TestTheRuleAgainstARedisThatLosesData = RedisThatLosesData.TestCase
TestTheRuleAgainstARedisThatLosesData.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
