"""bench/cluster.py runs end to end at tiny sizes, so that it cannot rot: one server and a
3-master cluster of its own, a row each, the cluster's Redis CPU split over its three shards,
and the target line judged."""

from __future__ import annotations

import pytest

from bench import cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_both_topologies_are_measured_and_the_cluster_compared_with_one_server(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--calls", "300", "--seq-calls", "50", "--inflight", "8", "--endpoints", "6"]
    assert cluster.main([*argv, "--repeat", "1", "--markdown"]) == 0
    out = capsys.readouterr().out
    rows = {
        cells[0]: cells
        for line in out.splitlines()
        if line.startswith(("| server |", "| cluster |"))
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert set(rows) == {"server", "cluster"}
    assert rows["server"][2] == "1.00x" and rows["server"][4] == "1.00x"
    shards = [float(s) for s in rows["cluster"][6].split(" / ")]
    assert len(shards) == 3 and all(s > 0 for s in shards)  # every shard did work
    assert float(rows["cluster"][3].replace(",", "")) > 0
    assert "target: cluster throughput >= 0.8x" in out
