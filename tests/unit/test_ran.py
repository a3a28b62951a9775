"""RanRequests: at_least_once redeliveries are known by sequence number within the endpoint's
generation (the node's epoch and the counter's life); answers belong to the latest run of an id."""

from __future__ import annotations

from prq.node.receiver.ran import RanRequests

E = "poll://e"


def test_a_redelivery_of_a_run_request_is_not_run_again_and_gets_its_answer() -> None:
    ran = RanRequests()
    assert ran.first_run(E, 5, "a", 1, generation=(0, 1))
    ran.remember("a", b"answer")
    assert not ran.first_run(E, 5, "a", 2, generation=(0, 1))
    assert ran.response("a") == b"answer"


def test_a_new_generation_forgets_the_numbers() -> None:
    ran = RanRequests()
    assert ran.first_run(E, 5, "a", 1, generation=(0, 1))
    # the counter expired (a new life) or went back (a new epoch): 5 is another request now
    assert ran.first_run(E, 5, "b", 2, generation=(0, 2))
    assert ran.first_run(E, 5, "c", 2, generation=(1, 2))
    assert not ran.first_run(E, 5, "c", 3, generation=(1, 2))


def test_an_id_run_again_under_a_new_number_drops_the_earlier_answer() -> None:
    ran = RanRequests()
    assert ran.first_run(E, 5, "job-1", 1, generation=(0, 1))
    ran.remember("job-1", b"yesterday")
    assert ran.first_run(E, 9, "job-1", 1, generation=(0, 1))
    # its run ended unanswered (cancelled); a redelivery must not get yesterday's answer
    assert not ran.first_run(E, 9, "job-1", 2, generation=(0, 1))
    assert ran.response("job-1") is None
