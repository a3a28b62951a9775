"""RanRequests: at_least_once redeliveries are known by sequence number (numbers never repeat on
an endpoint); answers belong to the latest run of an id."""

from __future__ import annotations

from prq.node.receiver.ran import RanRequests

E = "poll://e"


def test_a_redelivery_of_a_run_request_is_not_run_again_and_gets_its_answer() -> None:
    ran = RanRequests()
    assert ran.first_run(E, 5, "a", 1)
    ran.remember("a", b"answer")
    assert not ran.first_run(E, 5, "a", 2)
    assert ran.response("a") == b"answer"


def test_a_first_attempt_is_never_a_redelivery() -> None:
    ran = RanRequests()
    assert ran.first_run(E, 5, "a", 1)
    assert ran.first_run(E, 5, "a", 1)


def test_an_id_run_again_under_a_new_number_drops_the_earlier_answer() -> None:
    ran = RanRequests()
    assert ran.first_run(E, 5, "job-1", 1)
    ran.remember("job-1", b"yesterday")
    assert ran.first_run(E, 9, "job-1", 1)
    # its run ended unanswered (cancelled); a redelivery must not get yesterday's answer
    assert not ran.first_run(E, 9, "job-1", 2)
    assert ran.response("job-1") is None
