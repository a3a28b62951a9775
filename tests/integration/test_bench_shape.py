"""bench/shape.py runs end to end at a tiny size, so that it cannot rot: each shape's calls
complete (a reply for another request would raise), every shape has its row and ratio, and the
run leaves no key behind."""

from __future__ import annotations

import re

import pytest
import redis

from bench import shape

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.one_server  # the shapes are written for one server's client
def test_every_shape_is_timed_against_the_raw_rpc(
    redis_admin_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a server
    # When the three shapes run a few calls each
    assert shape.main(["--url", redis_admin_url, "--calls", "40", "--warmup", "5"]) == 0
    out = capsys.readouterr().out
    # Then each has its row, the scripted ones with their ratio to the raw RPC
    for name in shape.SHAPES:
        row = re.search(rf"{name}\s*│\s*([\d.]+)\s*│\s*([\d.]+)\s*│\s*(\S+)", out)
        assert row is not None, f"no row for {name}:\n{out}"
        assert float(row.group(1)) > 0
        assert (row.group(3) == "-") == (name == "raw")
    # And nothing of the run is left in Redis
    client = redis.Redis.from_url(redis_admin_url)
    try:
        assert list(client.scan_iter(match="bench-shape-*", count=1000)) == []
    finally:
        client.close()
