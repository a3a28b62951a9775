"""Judging a Redis configuration from INFO (prq.protocol.health)."""

from __future__ import annotations

import pytest

from prq.protocol.health import parse_info, redis_persistence, redis_warnings

INFO_TEXT = b"""# Memory
maxmemory:0
maxmemory_policy:noeviction

# Persistence
aof_enabled:0
rdb_saves:0
rdb_last_load_keys_loaded:0
"""


def test_parse_info_reads_raw_text_and_parsed_mappings() -> None:
    info = parse_info(INFO_TEXT, {"redis_version": "7.0.15"}, None)
    assert info["maxmemory_policy"] == "noeviction"
    assert info["redis_version"] == "7.0.15"
    assert "# Memory" not in info


def test_a_redis_as_prq_wants_it_gets_no_warning() -> None:
    assert redis_warnings(parse_info(INFO_TEXT), save="") == []
    assert redis_warnings(parse_info(INFO_TEXT)) == []


@pytest.mark.parametrize(
    ("overrides", "save", "expected"),
    [
        ({"maxmemory": "100", "maxmemory_policy": "allkeys-lru"}, "", ["evicts"]),
        # a policy without a memory limit never evicts
        ({"maxmemory": "0", "maxmemory_policy": "allkeys-lru"}, "", []),
        ({"aof_enabled": "1"}, "", ["persists data (aof)"]),
        ({}, "3600 1", ["persists data (rdb snapshots)"]),
        # without CONFIG (least-privilege user), INFO's signs stand in
        ({"rdb_saves": "2"}, None, ["persists data (rdb snapshots)"]),
        ({"rdb_last_load_keys_loaded": "10"}, None, ["persists data (rdb snapshots)"]),
        ({"aof_enabled": "1", "maxmemory": "5", "maxmemory_policy": "volatile-ttl"}, "1 1",
         ["evicts", "persists data (aof, rdb snapshots)"]),
    ],
)  # fmt: skip
def test_eviction_and_persistence_are_named(
    overrides: dict[str, str], save: str | None, expected: list[str]
) -> None:
    info = parse_info(INFO_TEXT) | overrides
    warnings = redis_warnings(info, save)
    assert len(warnings) == len(expected)
    for warning, fragment in zip(warnings, expected, strict=True):
        assert fragment in warning


def test_persistence_kinds() -> None:
    assert redis_persistence({"aof_enabled": "1"}, "") == ["aof"]
    assert redis_persistence({"rdb_saves": "garbage"}) == []
