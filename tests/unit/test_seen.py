"""SeenSequences: examples, the below-floor rule, persistence, and a stateful model check."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from prq.node.receiver.seen import SeenSequences


def gaps(seen: SeenSequences) -> list[list[int]]:
    gap_list: list[list[int]] = seen.to_state()["gaps"]
    return gap_list


def test_empty() -> None:
    seen = SeenSequences()
    assert seen.highest is None
    assert (seen.gap_count, seen.interval_count, seen.floor) == (0, 0, 0)
    assert 0 not in seen


def test_in_order_keeps_no_gaps() -> None:
    seen = SeenSequences()
    assert all(seen.add(n) for n in range(100))
    assert (seen.highest, seen.gap_count, seen.interval_count) == (99, 0, 0)
    assert all(n in seen for n in range(100))
    assert 100 not in seen


def test_duplicates_are_reported() -> None:
    seen = SeenSequences()
    assert seen.add(0)
    assert not seen.add(0)
    assert seen.add(5)
    assert not seen.add(5)
    assert seen.add(3)
    assert not seen.add(3)


def test_reordering_fills_gaps() -> None:
    seen = SeenSequences()
    for n in (4, 2, 0, 3, 1):
        assert seen.add(n)
    assert (seen.highest, seen.gap_count, seen.interval_count) == (4, 0, 0)
    assert not any(seen.add(n) for n in range(5))


def test_huge_jump_costs_one_interval() -> None:
    seen = SeenSequences()
    assert seen.add(1)
    assert seen.add(10**12)
    assert gaps(seen) == [[0, 0], [2, 10**12 - 1]]
    assert seen.gap_count == 10**12 - 1
    assert 10**12 - 1 not in seen
    assert 10**12 in seen


def test_filling_splits_shrinks_and_removes_intervals() -> None:
    seen = SeenSequences()
    seen.add(10)
    assert gaps(seen) == [[0, 9]]
    seen.add(5)  # split
    assert gaps(seen) == [[0, 4], [6, 9]]
    seen.add(0)  # shrink from the start
    seen.add(9)  # shrink from the end
    assert gaps(seen) == [[1, 4], [6, 8]]
    for n in (6, 7, 8):
        seen.add(n)  # the last one removes the interval
    assert gaps(seen) == [[1, 4]]
    assert seen.gap_count == 4


def test_bound_drops_lowest_intervals_and_moves_floor() -> None:
    seen = SeenSequences(max_intervals=2)
    for n in (1, 3, 5):
        seen.add(n)  # gaps [0,0], [2,2], [4,4]: the lowest one is dropped
    assert gaps(seen) == [[2, 2], [4, 4]]
    assert (seen.floor, seen.interval_count, seen.gap_count) == (1, 2, 2)
    seen.add(7)
    assert gaps(seen) == [[4, 4], [6, 6]]
    assert seen.floor == 3


def test_below_floor_is_run_not_dropped() -> None:
    seen = SeenSequences(max_intervals=1)
    seen.add(1)
    seen.add(3)  # drops gap [0,0]; floor 1
    seen.add(6)  # drops gap [2,2]; floor 3
    assert seen.floor == 3
    # 1 was seen and 2 was not, but both are below the floor: untracked, so "run it".
    for n in (0, 1, 2):
        assert n not in seen
        assert seen.add(n)
        assert seen.add(n)  # still untracked: nothing is recorded below the floor
    assert seen.add(4)  # above the floor, in a gap: tracked normally
    assert not seen.add(4)


def test_split_beyond_the_bound_drops_the_lowest() -> None:
    seen = SeenSequences(max_intervals=1)
    seen.add(10)
    seen.add(5)  # split [0,9] into [0,4], [6,9]; [0,4] is dropped
    assert gaps(seen) == [[6, 9]]
    assert (seen.floor, seen.gap_count) == (5, 4)
    assert 5 in seen


def test_zero_intervals_tracks_only_the_top() -> None:
    seen = SeenSequences(max_intervals=0)
    seen.add(5)
    assert (seen.floor, seen.interval_count) == (5, 0)
    assert seen.add(3)
    assert not seen.add(5)


@pytest.mark.parametrize("bad", [-1, True, False, 1.0, "1", None])
def test_add_rejects_non_numbers(bad: Any) -> None:
    seen = SeenSequences()
    with pytest.raises(ValueError, match="non-negative int"):
        seen.add(bad)
    assert bad not in seen


@pytest.mark.parametrize("bad", [-1, True, 2.0])
def test_constructor_rejects_bad_bound(bad: Any) -> None:
    with pytest.raises(ValueError, match="max_intervals"):
        SeenSequences(max_intervals=bad)


def test_state_round_trip() -> None:
    seen = SeenSequences(max_intervals=3)
    for n in (2, 9, 4, 20, 30, 10**12):
        seen.add(n)
    state = json.loads(json.dumps(seen.to_state()))
    again = SeenSequences.from_state(state)
    assert again.to_state() == seen.to_state()
    for name in ("highest", "floor", "gap_count", "interval_count", "max_intervals"):
        assert getattr(again, name) == getattr(seen, name)
    assert not again.add(10**12)
    assert again.add(25)
    empty = SeenSequences.from_state(SeenSequences().to_state())
    assert empty.highest is None


def valid_state(**changes: Any) -> dict[str, Any]:
    state: dict[str, Any] = {
        "version": 1,
        "max_intervals": 4,
        "highest": 20,
        "floor": 2,
        "gaps": [[2, 3], [5, 9]],
    }
    state.update(changes)
    return state


def test_valid_state_helper_is_valid() -> None:
    seen = SeenSequences.from_state(valid_state())
    assert (seen.gap_count, seen.interval_count) == (7, 2)
    assert 4 in seen
    assert 3 not in seen


@pytest.mark.parametrize(
    "state",
    [
        None,
        [],
        {},
        {**valid_state(), "extra": 1},
        valid_state(version=2),
        valid_state(version=True),
        valid_state(max_intervals=-1),
        valid_state(max_intervals="4"),
        valid_state(max_intervals=1),  # more gaps than the bound
        valid_state(highest=-3),
        valid_state(highest=20.0),
        valid_state(floor=-1),
        valid_state(floor=True),
        valid_state(floor=21),  # above highest
        valid_state(floor=3),  # first gap below the floor
        valid_state(highest=None),  # gaps without a highest
        valid_state(gaps="[]"),
        valid_state(gaps=[[2, 3, 4]]),
        valid_state(gaps=[(2, 3)]),
        valid_state(gaps=[[2, "3"]]),
        valid_state(gaps=[[-1, 3]]),
        valid_state(gaps=[[5, 4]]),  # start after end
        valid_state(gaps=[[5, 9], [2, 3]]),  # unsorted
        valid_state(gaps=[[2, 6], [5, 9]]),  # overlapping
        valid_state(gaps=[[2, 4], [5, 9]]),  # adjacent: should have been one gap
        valid_state(gaps=[[5, 20]]),  # reaches highest
        valid_state(gaps=[[25, 30]]),  # above highest
    ],
)
def test_malformed_state_rejected(state: Any) -> None:
    with pytest.raises(ValueError):
        SeenSequences.from_state(state)


class SeenMachine(RuleBasedStateMachine):
    """Compare SeenSequences with a plain set of every number added."""

    max_intervals = 10_000

    def __init__(self) -> None:
        super().__init__()
        self.seen = SeenSequences(self.max_intervals)
        self.model: set[int] = set()
        self.floors = [0]

    def check_add(self, n: int) -> None:
        below_floor = n < self.seen.floor
        fresh = self.seen.add(n)
        if below_floor:
            assert fresh, "untracked numbers below the floor must be run"
        else:
            assert fresh == (n not in self.model)
        self.model.add(n)
        self.floors.append(self.seen.floor)

    @rule(n=st.integers(0, 40))
    def add_small(self, n: int) -> None:
        self.check_add(n)

    @rule(delta=st.integers(-25, 3))
    def add_near_top(self, delta: int) -> None:
        self.check_add(max(0, (self.seen.highest or 0) + delta))

    @rule(jump=st.integers(2, 10**12))
    def add_jump(self, jump: int) -> None:
        self.check_add((self.seen.highest or 0) + jump)

    @rule()
    def restart(self) -> None:
        state = self.seen.to_state()
        again = SeenSequences.from_state(state)
        assert again.to_state() == state
        self.seen = SeenSequences.from_state(json.loads(json.dumps(state)))
        assert self.seen.to_state() == state

    @precondition(lambda self: self.seen.highest is not None)
    @rule(data=st.data())
    def membership_sample(self, data: st.DataObject) -> None:
        highest = self.seen.highest
        assert highest is not None
        self.check_member(data.draw(st.integers(0, highest + 2)))

    def check_member(self, n: int) -> None:
        if n in self.seen:
            assert n in self.model, "a number never added must never look seen"
        elif n >= self.seen.floor:
            assert n not in self.model

    @invariant()
    def membership_agrees(self) -> None:
        top = self.seen.highest if self.seen.highest is not None else -1
        candidates = set(range(min(top + 3, 60))) | {top + 1, top + 2}
        for m in self.model:
            candidates |= {m - 1, m, m + 1}
        for start, end in gaps(self.seen):
            candidates |= {start - 1, start, end, end + 1}
        for n in candidates:
            if n >= 0:
                self.check_member(n)

    @invariant()
    def counts_agree(self) -> None:
        assert self.seen.interval_count <= self.max_intervals
        assert self.floors == sorted(self.floors), "the floor never moves down"
        if self.seen.highest is None:
            assert self.seen.gap_count == 0
            return
        assert self.seen.highest == max(self.model)
        tracked = sum(1 for m in self.model if m >= self.seen.floor)
        assert self.seen.gap_count == self.seen.highest + 1 - self.seen.floor - tracked
        if self.seen.floor == 0:
            assert self.seen.gap_count == self.seen.highest + 1 - len(self.model)


class SmallBoundMachine(SeenMachine):
    """The same checks with a bound of 3 gaps, so the floor moves often."""

    max_intervals = 3


MACHINE_SETTINGS = settings(max_examples=200, stateful_step_count=50, deadline=None)
TestSeenMachine = SeenMachine.TestCase
TestSeenMachine.settings = MACHINE_SETTINGS
TestSmallBoundMachine = SmallBoundMachine.TestCase
TestSmallBoundMachine.settings = MACHINE_SETTINGS
