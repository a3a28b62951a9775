"""KeySchema: injective, tag-safe encoding of endpoints."""

from __future__ import annotations

import re
import unicodedata
from importlib import resources

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prq import InvalidEndpoint
from prq.core.keys import KeySchema, decode_endpoint, encode_endpoint
from prq.core.names import MAX_ENDPOINT_LENGTH

printable = st.text(
    alphabet=st.characters(codec="utf-8").filter(str.isprintable),
    min_size=1,
    max_size=MAX_ENDPOINT_LENGTH,
)


@given(printable)
def test_encoding_round_trips_and_is_tag_safe(endpoint: str) -> None:
    encoded = encode_endpoint(endpoint)
    assert decode_endpoint(encoded) == endpoint
    assert not set(encoded) & set("{}:*?[]\\ \r\n\t\x00")


@given(printable, printable)
def test_distinct_endpoints_never_share_a_key(a: str, b: str) -> None:
    keys = KeySchema("prq")
    if a != b:
        assert keys.endpoint(a).levels != keys.endpoint(b).levels
        assert keys.endpoint(a).pulse_channel != keys.endpoint(b).pulse_channel


@given(printable)
def test_every_key_of_an_endpoint_has_one_hash_tag(endpoint: str) -> None:
    keys = KeySchema("prq").endpoint(endpoint)
    for key in (
        keys.levels,
        keys.share,
        keys.request("abc"),
        keys.renewal("abc"),
        keys.sequence,
        keys.take_receipt("t"),
    ):
        assert key.count("{") == 1
        assert key.count("}") == 1
        assert key.startswith(keys.tag)


def test_unicode_forms_are_distinct_endpoints() -> None:
    nfc = unicodedata.normalize("NFC", "poll://café")
    nfd = unicodedata.normalize("NFD", "poll://café")
    assert nfc != nfd
    assert encode_endpoint(nfc) != encode_endpoint(nfd)


@pytest.mark.parametrize(
    "endpoint",
    ["", "a\nb", "a\rb", "a\x00b", "tab\there", "x" * (MAX_ENDPOINT_LENGTH + 1), "\ud800"],
)
def test_invalid_endpoints_are_rejected(endpoint: str) -> None:
    with pytest.raises(InvalidEndpoint):
        encode_endpoint(endpoint)


def test_non_string_endpoint_is_rejected() -> None:
    with pytest.raises(InvalidEndpoint):
        encode_endpoint(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("prefix", ["", "a{b", "a}b", "a*", "a b", "a?", "a[b]"])
def test_invalid_prefixes_are_rejected(prefix: str) -> None:
    with pytest.raises(ValueError, match="invalid key prefix"):
        KeySchema(prefix)


@given(
    printable,
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.text(max_size=20),
    st.text(max_size=20),
)
def test_priority_levels_and_their_lanes_have_keys_of_their_own(
    endpoint: str, p: int, q: int, producer: str, other: str
) -> None:
    keys = KeySchema("prq").endpoint(endpoint)
    others = {keys.levels, keys.share, keys.old_levels, keys.sequence, keys.parked, keys.parks,
              keys.running, keys.limits, keys.receivers, *keys.dead, keys.request("1"),
              keys.take_receipt("t")}  # fmt: skip

    def level_keys(priority: int, name: str) -> set[str]:
        return {keys.level(priority), keys.level_lanes(priority), keys.front_lane(priority),
                keys.level_removed(priority), keys.producer_lane(priority, name)}  # fmt: skip

    mine = level_keys(p, producer)
    assert len(mine) == 5  # no producer's lane is the level's clock, lanes, front or removed set
    for key in mine:  # the endpoint's hash tag comes first, whatever text the producer holds
        assert key.startswith(keys.level_prefix) and key.startswith(keys.tag)
    assert not mine & others
    if p != q:
        assert not mine & level_keys(q, other)
    if producer != other:
        assert keys.producer_lane(p, producer) != keys.producer_lane(p, other)


def test_the_share_count_has_the_name_the_scripts_give_it() -> None:
    # _queue.lua is not passed the key: it names it as the levels key plus its SHARES suffix
    keys = KeySchema("prq").endpoint("poll://shares")
    source = resources.files("prq.protocol.scripts").joinpath("_queue.lua").read_text("utf-8")
    suffix = re.search(r"^local SHARES = '([^']+)'$", source, re.MULTILINE)
    assert suffix is not None
    assert keys.share == keys.levels + suffix.group(1)
