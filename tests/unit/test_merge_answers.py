"""Answers to one endpoint that go out in one round trip are merged into one script call
(prq.protocol.scripts.merging.merge_answers), and each caller still gets its own reply."""

from __future__ import annotations

from redis.exceptions import NoScriptError

from prq.core.keys import KeySchema
from prq.protocol.effects import Call, Reply
from prq.protocol.scripts.answer import apply_response_call
from prq.protocol.scripts.merging import MAX_MERGED_ANSWERS, merge_answers

KEYS = KeySchema("t")


def answer(endpoint: str, request_id: str) -> Call:
    return apply_response_call(
        KEYS.endpoint(endpoint), request_id, "token", b'{"id":"x"}', 1000, 5, 16384
    )


def test_answers_to_one_endpoint_go_as_one_call_where_the_first_stood() -> None:
    # Given a batch: an answer, a take-like call, two more answers to the same endpoint, and one
    # to another endpoint
    other = Call(("GET", "t:k"))
    calls = [answer("poll://a", "1"), other, answer("poll://a", "2"), answer("poll://b", "3"),
             answer("poll://a", "4")]  # fmt: skip

    # When they are merged
    sent, spread = merge_answers(calls)

    # Then the three answers to poll://a are one call at the first one's place, the rest unmoved
    assert [call.args[0] for call in sent] == ["EVALSHA", "GET", "EVALSHA"]
    ids = [arg for arg in sent[0].args if arg in ("1", "2", "3", "4")]
    assert ids == ["1", "2", "4"]
    assert sent[1] is other and sent[2] is calls[3]
    # And each call gets its own status back
    replies: list[Reply] = [[b"ok", b"fenced", b"replay"], b"v", [b"unknown"]]
    assert spread(replies) == [[b"ok"], b"v", [b"fenced"], [b"unknown"], [b"replay"]]


def test_an_error_reply_of_a_merged_call_goes_to_every_answer_it_carried() -> None:
    calls = [answer("poll://a", "1"), answer("poll://a", "2")]
    sent, spread = merge_answers(calls)
    assert len(sent) == 1
    error = NoScriptError("NOSCRIPT")
    assert spread([error]) == [error, error]


def test_nothing_to_merge_sends_the_calls_as_they_are() -> None:
    calls = [answer("poll://a", "1"), answer("poll://b", "2"), Call(("PING",))]
    sent, spread = merge_answers(calls)
    assert sent == calls
    assert spread([b"x", b"y", b"z"]) == [b"x", b"y", b"z"]


def test_a_merged_call_carries_at_most_the_cap_of_answers() -> None:
    calls = [answer("poll://a", str(i)) for i in range(2 * MAX_MERGED_ANSWERS + 1)]
    sent, spread = merge_answers(calls)
    assert len(sent) == 3
    replies: list[Reply] = [[b"ok"] * MAX_MERGED_ANSWERS, [b"ok"] * MAX_MERGED_ANSWERS, [b"stale"]]
    out = spread(replies)
    assert out[:-1] == [[b"ok"]] * (2 * MAX_MERGED_ANSWERS) and out[-1] == [b"stale"]
