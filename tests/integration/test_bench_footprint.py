"""bench/footprint.py runs end to end at tiny sizes, so that it cannot rot: on a server of its
own (its default, flushed between variants) and on a server it is given, which it must not flush.

The checks are about the instrument, not about prq's layout (which issue 16 changes): every
variant has its row, a request costs at least its payload, the breakdown adds up to the total.
"""

from __future__ import annotations

import re

import pytest
import redis

from bench import footprint
from bench.footprint_measures import BULK, KEYED, LIST, NOTIFY, SCRIPTED, SEND
from bench.footprint_report import HEADERS, PART_HEADERS

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _rows(out: str, variant: str) -> list[list[str]]:
    """The cells of the markdown rows that start with `variant`."""
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in out.splitlines()
        if line.startswith(f"| {variant} |")
    ]


def _number(cell: str) -> float:
    return float(cell.replace(",", "").removesuffix("x").removesuffix("%"))


def test_on_its_own_server_every_variant_is_measured_and_compared(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given no server named: the bench starts its own
    monkeypatch.delenv("PRQ_REDIS_URL", raising=False)
    argv = ["--sizes", "300", "--kib-sizes", "200", "--one-by-one", "50", "--markdown"]
    # When it runs at tiny sizes
    assert footprint.main(argv) == 0
    out = capsys.readouterr().out
    # Then the list and prq rows are there, and a request costs at least its payload
    table = {
        (variant, row[1], row[2]): row
        for variant in (
            LIST,
            KEYED,
            SCRIPTED,
            BULK,
            NOTIFY,
            SEND,
        )
        for row in _rows(out, variant)
        if len(row) == len(HEADERS)
    }
    expected = [
        (LIST, "100 B", "300"), (KEYED, "100 B", "300"),
        (SCRIPTED, "100 B", "300"), (BULK, "100 B", "300"),
        (LIST, "1,024 B", "200"), (KEYED, "1,024 B", "200"),
        (SCRIPTED, "1,024 B", "200"), (BULK, "1,024 B", "200"),
        (LIST, "100 B", "50"), (NOTIFY, "100 B", "50"),
        (SEND, "100 B", "50"),
    ]  # fmt: skip
    assert sorted(table) == sorted(expected)
    for (variant, payload, _), row in table.items():
        assert _number(row[3]) >= int(payload.split()[0].replace(",", "")), (variant, row)
        ratio = row[4]
        assert (ratio == "-") == (variant == LIST), row
    assert table[(LIST, "100 B", "300")][5] == f"{1 / 300:.5g}"  # one list key
    # And the targets are judged, never asserted
    assert re.search(r"bulk, 100 B, 300 queued: .* B per request .* (PASS|MISS);", out)
    # ...beside the two floors measured in the same run
    assert re.search(r"µs per request \([\d.]+x the keyed write, [\d.]+x the scripted one in", out)
    # And the breakdown of each prq run adds up to its bytes per request
    for variant, payload, queued in expected:
        if variant in (LIST, KEYED, SCRIPTED):  # (no breakdown)
            continue
        parts = [
            row
            for row in _rows(out, variant)
            if len(row) == len(PART_HEADERS) and row[1:3] == [payload, queued]
        ]
        assert any(row[3] == "request record" for row in parts), parts
        total = _number(table[(variant, payload, queued)][3])
        assert sum(_number(row[7]) for row in parts) == pytest.approx(total, abs=1.0)


@pytest.mark.one_server  # the benchmark measures one server
def test_on_a_given_server_it_flushes_nothing_and_leaves_no_key(
    redis_admin_url: str,
    redis_client: redis.Redis,
    key_prefix: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given a server with someone else's key on it
    redis_client.set(f"{key_prefix}:theirs", "kept")
    # When the bench runs on it
    argv = ["--url", redis_admin_url, "--sizes", "100", "--kib-sizes", "", "--one-by-one", "20"]
    assert footprint.main([*argv, "--markdown"]) == 0
    # Then it measured under a prefix of its own, deleted it, and flushed nothing
    out = capsys.readouterr().out
    assert "given server" in out
    assert _rows(out, BULK)
    assert redis_client.get(f"{key_prefix}:theirs") == b"kept"
    assert list(redis_client.scan_iter(match="prq:footprint-*", count=1000)) == []
