"""Reply parsers of the Lua steps: typed values, or SerializationError for anything else."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from prq import SerializationError
from prq.protocol.scripts.answer import parse_apply_response
from prq.protocol.scripts.enqueue import parse_enqueue, parse_enqueue_many
from prq.protocol.scripts.loading import ALL_SCRIPTS
from prq.protocol.scripts.request_state import parse_snapshot, parse_withdraw
from prq.protocol.scripts.take import TakeReply, parse_take


def test_every_script_documents_keys_argv_reply_and_invariants() -> None:
    for script in ALL_SCRIPTS:
        header = script.source.split("]]", 1)[0]
        for section in ("KEYS[1]", "Reply", "Invariants"):
            assert section in header, (script.name, section)


def test_parse_enqueue() -> None:
    new = parse_enqueue([b"new", 7, 3, 90, -1])
    assert (new.counter, new.before, new.stamp, new.went_back) == (7, 3, 90, None)
    assert not new.refused
    assert parse_enqueue([b"handed", 8, 0, 91, -1]).handed
    known = parse_enqueue([b"known", b"done", b'{"id":"a"}', b"", 92, -1])
    assert known.known is not None and known.stamp == 92
    assert known.known.state == "done"
    assert known.known.response == b'{"id":"a"}'
    # (a first attempt that found the node's stamp low, or gone: queued, the loss told)
    low = parse_enqueue([b"new", 7, 3, 12, 12])
    assert (low.counter, low.went_back, low.refused) == (7, 12, False)
    assert parse_enqueue([b"new", 7, 3, 0, 0]).went_back == 0
    # (sent again, and found it low: nothing was written)
    back = parse_enqueue([b"back", 12])
    assert (back.counter, back.known, back.went_back, back.refused) == (None, None, 12, True)


@pytest.mark.parametrize(
    "reply",
    [
        [b"new", 7, 3],  # no stamp (an older script's)
        [b"new", 7, 3, 90],
        [b"known", b"done", b"", b"", 5],
        [b"back"],
        [b"new", 7, 3, b"x", -1],
        b"OK",
    ],
)
def test_parse_enqueue_refuses_a_reply_of_another_shape(reply: object) -> None:
    with pytest.raises(SerializationError):
        parse_enqueue(reply)  # type: ignore[arg-type]


def test_parse_enqueue_many() -> None:
    # 2 accepted, 1 duplicate, counter 40, 1 refused, 1,500 queued after the batch, 1 gone,
    # 2 repeated, 1 conflict
    reply = [2, 1, 40, 1, 1500, 1, 2, 1, b"dup", b"full", b"gone", b"again-1", b"again-2", b"c"]
    outcome = parse_enqueue_many(reply, 8)  # type: ignore[arg-type]
    assert (outcome.accepted, outcome.counter, outcome.depth) == (2, 40, 1500)
    assert (outcome.duplicate_ids, outcome.refused_ids) == (["dup"], ["full"])
    assert (outcome.gone_ids, outcome.repeated_ids) == (["gone"], ["again-1", "again-2"])
    assert outcome.conflict_ids == ["c"]
    assert parse_enqueue_many([1, 0, 7, 0, 1, 0, 0, 0], 1).gone_ids == []


@pytest.mark.parametrize(
    "reply",
    [
        [2, 1, 40, 1, 1500, 1, 0, b"dup", b"full", b"gone"],  # no conflicts (an older script's)
        [2, 1, 40, 1, 1500, 1, 0, 0, b"dup", b"full"],  # an id missing
        [2, 1, 40, 1, b"many", 1, 0, 0, b"dup", b"full", b"gone"],  # depth not a number
        [3, 1, 40, 1, 1500, 0, 0, 0, b"dup", b"full"],  # counts over what was sent
        b"OK",
    ],
)
def test_parse_enqueue_many_refuses_a_reply_of_another_shape(reply: object) -> None:
    with pytest.raises(SerializationError):
        parse_enqueue_many(reply, 4)  # type: ignore[arg-type]


def test_parse_take() -> None:
    reply = [2, 9, 1, 0, 77, -1, b"id1", b"{}", b"1", b"1700000000000", b"41", b"id2", b"{}"]
    reply += [b"3", b"0", b""]
    taken = parse_take(reply)  # type: ignore[arg-type]
    assert (taken.skipped, taken.counter, taken.redelivered, taken.limited) == (2, 9, 1, False)
    assert (taken.stamp, taken.went_back) == (77, None)
    assert [(i.request_id, i.attempt, i.created_ms, i.sequence) for i in taken.items] == [
        ("id1", 1, 1_700_000_000_000, 41),
        ("id2", 3, 0, 0),
    ]
    assert parse_take([0, 0, 0, 1, 5, -1]) == TakeReply(0, 0, 0, [], limited=True, stamp=5)
    # (a take answered from its receipt did not look at the limits)
    assert parse_take([0, 0, 0, -1, 5, -1]).limited is None
    # (a stamp found below the one sent, or gone: Redis went back)
    assert parse_take([0, 0, 0, -1, 90, 12]).went_back == 12
    assert parse_take([0, 0, 0, -1, 90, 0]).went_back == 0


def test_parse_withdraw() -> None:
    snapshot, mine = parse_withdraw([b"withdrawn", b"", b"cancelled", 1])
    assert mine and snapshot.reason == "cancelled"
    with pytest.raises(SerializationError):
        parse_withdraw([b"withdrawn", b"", b"cancelled"])


@pytest.mark.parametrize(
    "reply",
    [
        None,
        b"x",
        [],
        [0],
        [0, 0],
        [0, 0, 0],
        [b"0", 0, 0, 0],
        [0, 0, 0, b"0"],
        [0, 1, 0, 0, b"id"],
        [0, 1, 0, 0, b"a", b"b", b"1", b"2"],
        ValueError("x"),
    ],
)
def test_parse_take_rejects_malformed(reply: object) -> None:
    with pytest.raises(SerializationError):
        parse_take(reply)  # type: ignore[arg-type]


def test_parse_apply_response() -> None:
    assert parse_apply_response(b"ok") == "ok"
    with pytest.raises(SerializationError):
        parse_apply_response(b"weird")


def test_parse_snapshot() -> None:
    snapshot = parse_snapshot([b"withdrawn", b"", b"pickup_timeout", b"", 0])
    assert (snapshot.state, snapshot.reason) == ("withdrawn", "pickup_timeout")
    assert snapshot.pickup_left_ms is None and not snapshot.redelivered
    queued = parse_snapshot([b"queued", b"", b"", 1234, 1])
    assert queued.pickup_left_ms == 1234 and queued.redelivered
    assert parse_snapshot([b"queued", b"", b"", -5, 0]).pickup_left_ms == -5
    assert parse_snapshot([b"queued", b"", b"", b"garbage", 0]).pickup_left_ms is None
    for malformed in ([b"done"], [b"queued", b"", b"", b""]):
        with pytest.raises(SerializationError):
            parse_snapshot(malformed)  # type: ignore[arg-type]
    with pytest.raises(SerializationError):
        parse_enqueue([b"surprise"])


def test_parse_beat_reads_the_progress_and_ignores_junk_in_it() -> None:
    from prq.protocol.scripts.liveness import parse_beat

    assert parse_beat([b"taken", b"", b"5/10"]) == ("taken", "", (5, 10))
    assert parse_beat([b"taken", b"", b""]) == ("taken", "", None)
    assert parse_beat([b"cancelled", b"sender_lost", b"x/-1"]) == ("cancelled", "sender_lost", None)
    with pytest.raises(SerializationError):
        parse_beat([b"taken", b""])


def _code(lua: str) -> str:
    """Lua without its comments (a block, or the rest of a line)."""
    return re.sub(r"--\[\[.*?\]\]|--[^\n]*", "", lua, flags=re.DOTALL)


def test_every_helper_a_script_calls_is_in_it_and_the_helpers_keep_their_layout() -> None:
    # The helper files: every function starts a line with `local function` and ends at the
    # first line that is `end` alone (load_script leaves out those a script does not call)
    files = resources.files("prq.protocol.scripts")
    helpers: set[str] = set()
    for path in files.iterdir():
        if path.name.startswith("_") and path.name.endswith(".lua"):
            text = path.read_text("utf-8")
            assert "'--" not in text and '"--' not in text, path.name  # (no "--" in a string)
            functions = re.findall(r"^local function (\w+)\(", text, re.MULTILINE)
            assert len(functions) == len(re.findall(r"^end$", text, re.MULTILINE)), path.name
            top = re.compile(r"^(?!local function |end$|local \w+ = |\s|$)", re.MULTILINE)
            assert not top.search(_code(text)), path.name  # (top level: functions, constants)
            helpers.update(functions)
    assert {"body_read", "queue_pop", "redeliver", "hand_off"} <= helpers
    # And each script defines every helper it names, and only those
    for script in ALL_SCRIPTS:
        code = _code(script.source)
        defined = set(re.findall(r"^local function (\w+)\(", code, re.MULTILINE))
        for helper in helpers:
            named = re.search(rf"\b{helper}\b(?!\()", code) or re.search(
                rf"(?<!local function )\b{helper}\(", code
            )
            assert bool(named) == (helper in defined), (script.name, helper)
