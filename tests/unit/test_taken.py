"""TakenRequests: a hand-out is known by its sequence number and request id, so an id sent again
is a new request while a rolled-back Redis handing out the same request again is caught."""

from __future__ import annotations

from prq import QueueSettings, RedisSettings, Request
from prq.core.models import encode_stored_request
from prq.facade.blocking_queue import Queue
from prq.node.receiver.taken import TakenRequests
from prq.protocol.scripts.take import TakenItem

E = "poll://e"


def test_an_id_sent_again_after_its_record_expired_is_a_new_request() -> None:
    taken = TakenRequests()
    assert taken.take(E, 1, "job-1", 1) == "first"
    assert taken.take(E, 2, "job-1", 1) == "first"


def test_the_same_hand_out_again_is_a_rollback() -> None:
    taken = TakenRequests()
    assert taken.take(E, 7, "a", 2, serial=5) == "first"
    assert taken.take(E, 7, "a", 2, serial=6) == "again"
    assert taken.take(E, 7, "a", 1, serial=6) == "again"  # an older state of it, taken later
    assert taken.take(E, 7, "a", 1) == "again"  # (the take's order unknown)
    # at_least_once: handed out again after a lost receiver
    assert taken.take(E, 7, "a", 3, serial=7) == "first"


def test_an_earlier_attempt_from_an_earlier_take_is_a_late_reply_not_a_rollback() -> None:
    # Given attempt 2 of a request got by this node's take number 9
    taken = TakenRequests()
    assert taken.take(E, 7, "a", 2, serial=9) == "first"
    # When the reply of its take number 8, which got attempt 1 before, comes only now
    # Then it is late (that take's token lost the request), not a rollback; and the memory
    # still holds attempt 2, so the same hand-out again is one
    assert taken.take(E, 7, "a", 1, serial=8) == "late"
    assert taken.take(E, 7, "a", 2, serial=10) == "again"
    # (the same attempt from an earlier take is no late reply: a hand-out is one attempt)
    assert taken.take(E, 7, "a", 2, serial=8) == "again"


def test_the_same_number_of_another_id_or_endpoint_is_another_request() -> None:
    taken = TakenRequests()
    assert taken.take(E, 7, "a", 1) == "first"
    assert taken.take(E, 7, "b", 1) == "first"
    assert taken.take("poll://other", 7, "b", 1) == "first"


def test_an_unknown_sequence_number_cannot_be_judged() -> None:
    taken = TakenRequests()
    assert taken.take(E, 0, "a", 1) == "first"
    assert taken.take(E, 0, "a", 1) == "first"


def test_the_oldest_hand_outs_are_forgotten_first() -> None:
    taken = TakenRequests(max_items=2)
    for sequence in (1, 2, 3):
        assert taken.take(E, sequence, f"r{sequence}", 1) == "first"
    assert taken.take(E, 3, "r3", 1) == "again"
    assert taken.take(E, 1, "r1", 1) == "first"


def test_a_take_with_one_repeat_refuses_its_other_items_behind_the_new_fence() -> None:
    # Given a node (never started) that took request "a", numbered 100, before
    queue = Queue(RedisSettings(url="redis://127.0.0.1:9/0"), settings=QueueSettings())
    try:
        endpoint = "poll://rolled-back"
        assert queue._taken.take(endpoint, 100, "a", 1) == "first"

        def item(request_id: str, sequence: int) -> TakenItem:
            body = encode_stored_request(Request(id=request_id, endpoint=endpoint, method="m"))
            return TakenItem(request_id, body, 1, 0, sequence)

        # When a rolled-back Redis hands it "b" (numbered 90, taken by another node before
        # the rollback), then "a" again, then "c" (numbered 120, queued after the rollback),
        # in one take
        items = [item("b", 90), item("a", 100), item("c", 120)]
        adopted = queue._adopt(endpoint, "t", items, {i.request_id: i.body for i in items})

        # Then the repeat declares the loss, fenced at 100, and "b" is refused with it: only
        # "c" runs (before, "b", met ahead of the repeat, was run)
        assert sorted(adopted.refused) == ["a", "b"]
        assert [p.id for p in adopted.good] == ["c"]
        assert queue._watch.data_loss.fence_of(endpoint) == 100
    finally:
        queue.close()
