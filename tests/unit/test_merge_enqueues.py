"""Enqueues to one endpoint that go out in one round trip are merged into one script call
(prq.protocol.scripts.merging.merge_enqueues), and each caller still gets its own reply."""

from __future__ import annotations

from redis.exceptions import NoScriptError

from prq.core.keys import KeySchema
from prq.protocol.effects import Call, Reply
from prq.protocol.scripts.answer import apply_response_call
from prq.protocol.scripts.enqueue import ENQUEUE_ARGS, ENQUEUE_KEYS, enqueue_call
from prq.protocol.scripts.merging import MAX_MERGED_ENQUEUES, merge_calls, merge_enqueues

KEYS = KeySchema("t")


def enqueue(endpoint: str, request_id: str) -> Call:
    return enqueue_call(
        KEYS.endpoint(endpoint), request_id, b'{"id":"x"}', "node", 5, 1000, 2000, 3000, 4000,
        5000, 600, 7000, priority=1, producer="p",
    )  # fmt: skip


def test_enqueues_to_one_endpoint_go_as_one_call_where_the_first_stood() -> None:
    # Given a batch: an enqueue, another call, two more enqueues to the same endpoint, and one
    # to another endpoint
    other = Call(("GET", "t:k"))
    calls = [enqueue("poll://a", "1"), other, enqueue("poll://a", "2"), enqueue("poll://b", "3"),
             enqueue("poll://a", "4")]  # fmt: skip

    # When they are merged
    sent, spread = merge_enqueues(calls)

    # Then the three enqueues to poll://a are one call at the first one's place: the endpoint's
    # keys once, each other request's record and stamp keys after them, each request's values
    # in order
    assert [call.args[0] for call in sent] == ["EVALSHA", "GET", "EVALSHA"]
    merged = sent[0].args
    first = calls[0].args
    stamp = 3 + ENQUEUE_KEYS - 1
    assert merged[1] == first[1] and merged[2] == ENQUEUE_KEYS + 4
    assert merged[3 : 3 + ENQUEUE_KEYS] == first[3 : 3 + ENQUEUE_KEYS]
    others = 3 + ENQUEUE_KEYS
    assert merged[others : others + 4] == (
        calls[2].args[3], calls[2].args[stamp], calls[4].args[3], calls[4].args[stamp],
    )  # fmt: skip
    values = merged[others + 4 :]
    assert len(values) == 3 * ENQUEUE_ARGS
    assert [values[i * ENQUEUE_ARGS] for i in range(3)] == ["1", "2", "4"]
    assert values[:ENQUEUE_ARGS] == first[3 + ENQUEUE_KEYS :]
    assert sent[1] is other and sent[2] is calls[3]
    # And each call gets its own reply back
    replies: list[Reply] = [[[b"new", 1], [b"known", b"queued", b"", b""], [b"new", 2]], b"v",
                            [b"new", 7]]  # fmt: skip
    assert spread(replies) == [
        [b"new", 1], b"v", [b"known", b"queued", b"", b""], [b"new", 7], [b"new", 2],
    ]  # fmt: skip


def test_an_error_reply_of_a_merged_call_goes_to_every_enqueue_it_carried() -> None:
    calls = [enqueue("poll://a", "1"), enqueue("poll://a", "2")]
    sent, spread = merge_enqueues(calls)
    assert len(sent) == 1
    error = NoScriptError("NOSCRIPT")
    assert spread([error]) == [error, error]


def test_a_lone_enqueue_is_sent_as_it_is() -> None:
    calls = [enqueue("poll://a", "1"), enqueue("poll://b", "2"), Call(("PING",))]
    sent, spread = merge_enqueues(calls)
    assert sent == calls
    assert spread([b"x", b"y", b"z"]) == [b"x", b"y", b"z"]


def test_a_merged_call_carries_at_most_the_cap_of_enqueues() -> None:
    calls = [enqueue("poll://a", str(i)) for i in range(2 * MAX_MERGED_ENQUEUES + 1)]
    sent, spread = merge_enqueues(calls)
    assert len(sent) == 3
    replies: list[Reply] = [[[b"new", 1]] * MAX_MERGED_ENQUEUES,
                            [[b"new", 2]] * MAX_MERGED_ENQUEUES, [b"new", 3]]  # fmt: skip
    out = spread(replies)
    assert out[:MAX_MERGED_ENQUEUES] == [[b"new", 1]] * MAX_MERGED_ENQUEUES
    assert out[-1] == [b"new", 3]


def test_answers_and_enqueues_of_one_batch_are_both_merged() -> None:
    keys = KEYS.endpoint("poll://a")
    answer = [apply_response_call(keys, str(i), "tok", b"{}", 1000, 5, 16384) for i in range(2)]
    calls = [enqueue("poll://a", "e1"), answer[0], enqueue("poll://a", "e2"), answer[1]]
    sent, spread = merge_calls(calls)
    assert len(sent) == 2
    replies: list[Reply] = [[[b"new", 1], [b"new", 2]], [b"ok", b"stale"]]
    assert spread(replies) == [[b"new", 1], [b"ok"], [b"new", 2], [b"stale"]]
