"""DataStreams on the wire, and the file store on its own (prq.datastreams)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from prq import Request, SerializationError
from prq.core.models import decode_request
from prq.datastreams import DataStream, FileSystemStore

GOOD = {"id": "a" * 32, "length": 3, "ref": "1-" + "a" * 32}


def body_with(stream: object) -> bytes:
    return json.dumps(
        {"endpoint": "poll://x", "method": "m", "id": "r1", "streams": {"f": stream}}
    ).encode()


def test_a_stream_reference_round_trips() -> None:
    request = decode_request(body_with(GOOD))
    stream = request.streams["f"]
    assert (stream.id, stream.length, stream.reference) == (GOOD["id"], 3, GOOD["ref"])
    assert json.loads(request.model_dump_json())["streams"] == {"f": GOOD}


@pytest.mark.parametrize(
    "stream",
    [
        {**GOOD, "length": -1},
        {**GOOD, "length": True},
        {**GOOD, "id": "../x"},
        {**GOOD, "ref": ""},
        {**GOOD, "ref": "x" * 513},
        {**GOOD, "extra": 1},
        "just text",
        None,
    ],
    ids=repr,
)
def test_malformed_stream_references_are_serialization_errors(stream: object) -> None:
    with pytest.raises(SerializationError):
        decode_request(body_with(stream))


def test_a_stream_name_must_be_plain() -> None:
    with pytest.raises(SerializationError):
        decode_request(
            json.dumps(
                {"endpoint": "poll://x", "method": "m", "id": "r1", "streams": {"a/b": GOOD}}
            ).encode()
        )


def test_an_unstored_stream_cannot_be_encoded_and_a_stored_one_counts_its_bytes(
    tmp_path: Path,
) -> None:
    request = Request(endpoint="poll://x", method="m", streams={"f": DataStream.from_bytes(b"x")})
    with pytest.raises(ValueError, match="not stored yet"):
        request.model_dump_json()
    store = FileSystemStore(tmp_path)
    stored = DataStream.from_chunks(iter([b"ab", b"cde"])).store_in(store, 2**40)
    assert stored.length == 5 and stored.stored
    stored.bind(store, delete_after_read=True)
    assert stored.read() == b"abcde" and stored.bytes_read == 5
    assert list(tmp_path.iterdir()) == []  # deleted once read


def test_the_file_store_keeps_extended_data_past_the_expiry_in_its_name(tmp_path: Path) -> None:
    # Given two pieces of data past the expiry they were stored with, one of them extended
    store = FileSystemStore(tmp_path)
    now_ms = int(time.time() * 1000)
    kept = store.store("a" * 32, [b"kept"], now_ms - 1)
    store.store("b" * 32, [b"gone"], now_ms - 1)
    store.extend(kept, now_ms + 60_000)
    store.extend(kept, now_ms + 1_000)  # (an extension never shortens)
    store.extend("1-" + "c" * 32, now_ms)  # (data gone already: nothing happens)
    # Then a sweep removes only the other one, and the extended one after its new expiry
    assert store.cleanup(now_ms + 1_000) == 1
    assert [path.name for path in tmp_path.iterdir()] == [kept]
    assert store.cleanup(now_ms + 59_000) == 0
    assert store.cleanup(now_ms + 60_001) == 1
