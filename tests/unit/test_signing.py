"""Signature renewals (prq.protocol.signing): only an authentic envelope is renewed; a renewal makes
the same request's same body valid again, nothing else; renewals come a moment after a take, then
once a period."""

from __future__ import annotations

import time

import pytest

from prq import SignatureError
from prq.protocol.signing import Renewals, Signer

KEY = b"k" * 32
ENDPOINT = "poll://renewed"
BODY = b'{"n":1}'


def later_ms() -> int:
    return int(time.time() * 1000) + 60_000


def test_a_renewal_makes_an_expired_envelope_valid_for_its_own_body_only() -> None:
    # Given an envelope that expired
    signer = Signer(KEY, clock_skew_ms=0)
    envelope = signer.sign("request", "r1", ENDPOINT, BODY, 1_000)
    with pytest.raises(SignatureError) as raised:
        signer.open("request", "r1", ENDPOINT, envelope)
    assert raised.value.reason == "expired"
    # When it is renewed, Then it verifies under the renewal
    header = signer.renewal("request", "r1", ENDPOINT, envelope, later_ms())
    assert signer.open("request", "r1", ENDPOINT, Signer.renewed(envelope, header)) == BODY
    # But the renewal makes no other body, request or endpoint valid
    other = signer.sign("request", "r1", ENDPOINT, b'{"n":2}', 1_000)
    with pytest.raises(SignatureError, match="does not match"):
        signer.open("request", "r1", ENDPOINT, Signer.renewed(other, header))
    with pytest.raises(SignatureError, match="does not match"):
        signer.open("request", "r2", ENDPOINT, Signer.renewed(envelope, header))
    with pytest.raises(SignatureError, match="does not match"):
        signer.open("request", "r1", "poll://elsewhere", Signer.renewed(envelope, header))
    # And a renewal is one signature header, nothing more
    for bad in (b"", b"junk\n", header + b"x", header.rstrip(b"\n")):
        with pytest.raises(SignatureError, match="one signature header"):
            Signer.renewed(envelope, bad)


@pytest.mark.parametrize("case", ["other_key", "tampered", "unsigned", "other_request"])
def test_only_an_authentic_envelope_is_renewed(case: str) -> None:
    signer = Signer(KEY, clock_skew_ms=0)
    envelope = {
        "other_key": Signer(b"x" * 32).sign("request", "r1", ENDPOINT, BODY, 1_000),
        "tampered": signer.sign("request", "r1", ENDPOINT, BODY, 1_000).replace(b"1}", b"2}"),
        "unsigned": BODY,
        "other_request": signer.sign("request", "r2", ENDPOINT, BODY, 1_000),
    }[case]
    with pytest.raises(SignatureError):
        signer.renewal("request", "r1", ENDPOINT, envelope, later_ms())


def test_renewals_come_a_moment_after_the_take_then_once_a_period() -> None:
    renewals = Renewals(first_after_s=1.0, every_s=10.0)
    held = {"r1"}
    renewals.hold("r1", ENDPOINT, b"envelope", 100.0)
    assert renewals.due(100.5, held.__contains__) == []  # (a quick call costs nothing)
    assert renewals.due(101.0, held.__contains__) == [("r1", ENDPOINT, b"envelope")]
    renewals.renewed({"r1": b"renewed"}, 101.0)
    assert renewals.due(110.9, held.__contains__) == []
    assert renewals.due(111.0, held.__contains__) == [("r1", ENDPOINT, b"renewed")]
    # What the node no longer holds is forgotten
    held.clear()
    assert renewals.due(111.0, held.__contains__) == []
    held.add("r1")
    assert renewals.due(200.0, held.__contains__) == []
