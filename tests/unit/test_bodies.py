"""The marker Redis keeps for a body over inline_limit_bytes (prq.core.bodies), and the store
chores around it (prq.protocol.stream_keeper), without Redis."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from prq import ConfigurationError, QueueSettings, Request, SerializationError
from prq.core.bodies import MARKER, is_spilled, marker, parse, stub
from prq.core.models import decode_request, decode_stored_request
from prq.datastreams import FileSystemStore
from prq.protocol.stream_keeper import StreamKeeper

BODY = b'{"endpoint":"poll://x","method":"m","params":"' + b"p" * 5000 + b'"}'
STUB = b'{"endpoint":"poll://x","method":"m"}'


def test_a_marker_names_the_body_and_carries_the_stub() -> None:
    data = marker("1-" + "a" * 32, BODY, STUB)
    assert is_spilled(data) and not is_spilled(BODY)
    found = parse(data)
    assert (found.reference, found.length) == ("1-" + "a" * 32, len(BODY))
    assert found.sha256 == hashlib.sha256(BODY).hexdigest()
    assert stub(data) == STUB and stub(BODY) == BODY
    assert found.check(BODY) == BODY


@pytest.mark.parametrize(
    "data",
    [
        MARKER + b'{"ref":"r","len":1}',  # no end of line
        MARKER + b"not json\n{}",
        MARKER + b'{"ref":"r","len":1}\n{}',  # no sha256
        MARKER + b'{"ref":7,"len":1,"sha256":"' + b"0" * 64 + b'"}\n{}',
        MARKER + b'{"ref":"r","len":-1,"sha256":"' + b"0" * 64 + b'"}\n{}',
        MARKER + b'{"ref":"r","len":true,"sha256":"' + b"0" * 64 + b'"}\n{}',
        MARKER + b'{"ref":"","len":1,"sha256":"' + b"0" * 64 + b'"}\n{}',
        MARKER + b'{"ref":"r","len":1,"sha256":"abc"}\n{}',
        MARKER + b"[1,2,3]\n{}",
        MARKER + b"x" * 5000 + b"\n{}",  # a header past the bound
    ],
)
def test_a_malformed_marker_is_a_serialization_error(data: bytes) -> None:
    with pytest.raises(SerializationError, match="marker"):
        parse(data)


def test_a_changed_body_fails_its_check() -> None:
    found = parse(marker("r", BODY, STUB))
    with pytest.raises(SerializationError, match="bytes"):
        found.check(BODY[:-1])
    with pytest.raises(SerializationError, match="SHA-256"):
        found.check(BODY[:-2] + b'x"')


def test_a_marker_is_never_taken_for_a_request() -> None:
    with pytest.raises(SerializationError):
        decode_request(marker("r", BODY, STUB))


def keeper(tmp_path: Path) -> StreamKeeper:
    config = QueueSettings(inline_limit_bytes=1024, max_body_bytes=10_000)
    return StreamKeeper(FileSystemStore(tmp_path), config)


def test_the_keeper_spills_only_over_the_limit_and_reads_back(tmp_path: Path) -> None:
    chores = keeper(tmp_path)
    assert not chores.spills(b"x" * 1024) and chores.spills(b"x" * 1025)
    assert not StreamKeeper(None, chores.settings).spills(b"x" * 5000)
    request = Request(endpoint="poll://x", method="m", params="p" * 3000, headers={"a": "b"})
    body = request.model_dump_json().encode()
    data = chores.spill_request(request, body, pickup_timeout_s=10)
    # the stub leaves the payload out, and the body comes back whole
    stub_request = decode_stored_request(stub(data), request.endpoint, request.id)
    assert stub_request == request.model_copy(update={"params": None, "headers": {}})
    assert chores.load_body(data, "request r") == body
    chores.delete_body(data)
    with pytest.raises(SerializationError, match="not in"):
        chores.load_body(data, "request r")


def test_a_marker_claiming_more_than_max_body_bytes_is_refused_unread(tmp_path: Path) -> None:
    chores = keeper(tmp_path)
    claim = MARKER + b'{"ref":"1-' + b"a" * 32 + b'","len":10001,"sha256":"' + b"0" * 64 + b'"}\n{}'
    with pytest.raises(SerializationError, match="max_body_bytes"):
        chores.load_body(claim, "request r")
    with pytest.raises(ConfigurationError, match="no DataStreamStore"):
        StreamKeeper(None, chores.settings).load_body(marker("r", BODY, STUB), "request r")


def test_cleanup_skips_a_part_file_its_writer_renamed_meanwhile(tmp_path: Path) -> None:
    store = FileSystemStore(tmp_path)
    part = tmp_path / ".1-x.part"
    part.write_bytes(b"half")
    with os.scandir(tmp_path) as entries:
        (entry,) = list(entries)
    part.unlink()  # (renamed into place by its writer)
    assert not store._due(entry, 10**15)
