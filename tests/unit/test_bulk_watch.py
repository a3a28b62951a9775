"""Which writers of one job may have lost what they wrote (prq.bulk.watch.may_have_lost), from
what each one's loss watch saw and the generation of the job's mark it joined; and a watch's
steps (no Redis here: the calls are built and their replies taken as Redis would give them)."""

from __future__ import annotations

from prq.bulk import LossWatch
from prq.bulk.watch import WatchStart, mark_key, may_have_lost
from prq.core.keys import KeySchema

A, B, C = 11, 22, 33  # generations of a job's mark


def test_writers_of_one_generation_that_saw_no_loss_lost_nothing() -> None:
    writers = [(WatchStart(100, A), False), (WatchStart(300, A), False), (None, False)]
    assert may_have_lost(writers) == [False, False, False]


def test_a_writer_whose_own_watch_saw_a_loss_may_have_lost_rows_and_so_may_its_generation() -> None:
    # (a flush while 1 wrote: 0 ended before it, unseen by its own watch; 2 began after it and
    # wrote a new mark)
    writers = [(WatchStart(100, A), False), (WatchStart(200, A), True), (WatchStart(500, B), False)]
    assert may_have_lost(writers) == [True, True, False]


def test_a_loss_while_no_writer_wrote_shows_in_the_next_generation() -> None:
    # (0 and 1 ended, Redis was flushed, 2 and 3 began: only the mark tells)
    writers = [
        (WatchStart(100, A), False), (WatchStart(150, A), False),
        (WatchStart(900, B), False), (WatchStart(950, B), False),
    ]  # fmt: skip
    assert may_have_lost(writers) == [True, True, False, False]
    # and two losses so: every generation but the last
    writers.append((WatchStart(2000, C), False))
    assert may_have_lost(writers) == [True, True, True, True, False]


def test_a_writer_that_wrote_nothing_lost_nothing_unless_its_watch_says_so() -> None:
    assert may_have_lost([(None, False), (WatchStart(5, A), True)]) == [False, True]
    assert may_have_lost([(None, False), (None, False)]) == [False, False]


def test_a_watch_started_with_its_first_writes_steps_once_per_round_trip_and_replays_safely() -> (
    None
):
    keys = KeySchema("prq").endpoint("poll://w")
    watch = LossWatch()
    # a round trip that starts it: the start before the writes, a step after them
    before, after = watch.around_calls(keys)
    assert (len(before), len(after)) == (1, 1)
    assert before[0].args[-2:] == (-1, watch.fresh)  # (written whatever it held)
    assert after[0].args[-2:] == (watch.fresh, watch.fresh + 1)
    watch.read([[watch.fresh, 1]], [[watch.fresh + 1, 2]])
    assert (watch.count, watch.lost, watch.endpoint) == (watch.fresh + 1, False, None)
    # the next one only steps, from the count on
    before, after = watch.around_calls(keys)
    assert before == [] and after[0].args[-2:] == (watch.fresh + 1, watch.fresh + 2)
    # and a step that finds the key gone (0) or another value says Redis lost data, for good
    watch.read([], [[0, 3]])
    assert watch.lost
    watch.read([], [[watch.fresh + 2, 4]])
    assert watch.lost
    # a watch that joined a job's mark renews it with each step (the mark lives past the
    # job's last batch, not its last task's start)
    watch.job = "run-1:ns"
    _, after = watch.around_calls(keys)
    assert after[1].args == ("PEXPIRE", mark_key(keys, "run-1:ns"), 3_600_000)
