"""`prq demo` as a user runs it: on its own embedded Redis, ending by itself or on Ctrl-C.

Ctrl-C in a terminal signals the whole foreground process group (the demo, its node processes
and its embedded redis-server); the demo must still stop its nodes in order and print its
summary, with no request left unanswered and no traceback.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SUMMARY = re.compile(r"prq demo: (\d+) calls in .*, (\d+) failed; handled by node A=(\d+), B=(\d+)")
#: Bounds a whole demo run (start, the calls, stopping its nodes and its Redis).
DEMO_TIMEOUT_S = 90.0


def demo_env() -> dict[str, str]:
    """No PRQ_* settings: the demo brings its own Redis, as on a fresh machine."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PRQ_")}


def assert_clean_summary(output: str) -> None:
    found = SUMMARY.search(output)
    assert found is not None, output[-3000:]
    calls, failed, by_a, by_b = (int(g) for g in found.groups())
    assert calls > 0 and failed == 0, output[-3000:]
    assert by_a > 0 and by_b > 0, output[-3000:]
    for bad in ("Traceback", "did not stop in time", "could not answer"):
        assert bad not in output, output[-3000:]


def test_the_demo_runs_for_its_duration_on_an_embedded_redis() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "prq.cli", "demo", "--duration", "3"],
        cwd=ROOT, env=demo_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=DEMO_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert_clean_summary(done.stdout + done.stderr)


def test_the_demo_runs_on_a_local_cluster_of_its_own() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "prq.cli", "demo", "--duration", "3", "--cluster"],
        cwd=ROOT, env=demo_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=DEMO_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "embedded Redis Cluster of 3 masters on redis+cluster://" in done.stdout
    assert_clean_summary(done.stdout + done.stderr)


def test_ctrl_c_to_the_process_group_stops_the_demo_cleanly() -> None:
    # Given the demo running until Ctrl-C, in a process group of its own (as in a terminal)
    demo = subprocess.Popen(
        [sys.executable, "-m", "prq.cli", "demo", "--duration", "0"],
        cwd=ROOT, env=demo_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    assert demo.stdout is not None
    lines: list[str] = []
    try:
        # When its first status line shows calls going on (it prints one every 2 s headless)
        deadline = time.monotonic() + DEMO_TIMEOUT_S
        for line in demo.stdout:  # ends when the demo exits; bounded by the deadline below
            lines.append(line)
            if re.search(r"\b[1-9]\d* calls\b", line) or time.monotonic() > deadline:
                break
        assert demo.poll() is None, "".join(lines)
        # And Ctrl-C reaches every process of the group
        os.killpg(demo.pid, signal.SIGINT)
        rest, _ = demo.communicate(timeout=DEMO_TIMEOUT_S)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait(10)
    output = "".join(lines) + rest

    # Then it stops its nodes in order, answers what they held and prints its summary
    assert demo.returncode == 0, output[-3000:]
    assert_clean_summary(output)
