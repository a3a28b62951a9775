"""TakenRequests: a hand-out is known by its sequence number (in one life of the counter) and
request id, so an id sent again is a new request while a rolled-back Redis is still caught."""

from __future__ import annotations

from prq.node.receiver.taken import TakenRequests

E = "poll://e"


def test_an_id_sent_again_after_its_record_expired_is_a_new_request() -> None:
    taken = TakenRequests()
    assert taken.take(E, 1, "job-1", 1, life=1, epoch=0) == "first"
    assert taken.take(E, 2, "job-1", 1, life=1, epoch=0) == "first"


def test_the_same_hand_out_again_is_a_rollback() -> None:
    taken = TakenRequests()
    assert taken.take(E, 7, "a", 2, life=1, epoch=0) == "first"
    assert taken.take(E, 7, "a", 2, life=1, epoch=0) == "again"
    assert taken.take(E, 7, "a", 1, life=1, epoch=0) == "again"  # an older state of it
    assert taken.take(E, 7, "a", 3, life=1, epoch=0) == "first"  # at_least_once: handed out again


def test_a_number_a_rolled_back_counter_gave_to_another_request_is_new() -> None:
    taken = TakenRequests()
    assert taken.take(E, 7, "a", 1, life=1, epoch=0) == "first"
    assert taken.take(E, 7, "b", 1, life=1, epoch=1) == "first"
    assert taken.take("poll://other", 7, "b", 1, life=1, epoch=1) == "first"


def test_after_a_declaration_the_lost_redis_is_refused_without_a_new_one() -> None:
    taken = TakenRequests()
    assert taken.take(E, 7, "a", 1, life=1, epoch=0) == "first"
    assert taken.take(E, 7, "a", 1, life=1, epoch=1) == "again_after_loss"


def test_a_new_life_of_the_counter_forgets_the_numbers() -> None:
    taken = TakenRequests()
    assert taken.take(E, 1, "job-1", 1, life=1, epoch=0) == "first"
    assert taken.take(E, 1, "job-1", 1, life=2, epoch=0) == "first"
    assert taken.take(E, 1, "job-1", 1, life=2, epoch=0) == "again"


def test_an_unknown_sequence_number_cannot_be_judged() -> None:
    taken = TakenRequests()
    assert taken.take(E, 0, "a", 1, life=1, epoch=0) == "first"
    assert taken.take(E, 0, "a", 1, life=1, epoch=0) == "first"


def test_the_oldest_hand_outs_are_forgotten_first() -> None:
    taken = TakenRequests(max_items=2)
    for sequence in (1, 2, 3):
        assert taken.take(E, sequence, f"r{sequence}", 1, life=1, epoch=0) == "first"
    assert taken.take(E, 3, "r3", 1, life=1, epoch=0) == "again"
    assert taken.take(E, 1, "r1", 1, life=1, epoch=0) == "first"
