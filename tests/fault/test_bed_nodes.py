"""Self-tests of node processes: a clean load through proxies, real kill -9, pause, self-stop."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import psutil
import pytest
import redis

from tests.fault.checker import check_nodes
from tests.fault.node_main import EXIT_LIFETIME, EXIT_UNFINISHED, PARENT_PID_ENV
from tests.fault.nodes import REPO_ROOT, NodeFactory
from tests.fault.proxy import FaultProxy
from tests.redis_servers import wait_until

pytestmark = pytest.mark.fault

MakeProxy = Callable[..., FaultProxy]


@pytest.mark.parametrize(
    ("receiver_facade", "sender_facade"), [("async", "sync"), ("sync", "async")]
)
def test_node_pair_200_calls_through_proxies_is_clean(
    nodes: NodeFactory,
    make_proxy: MakeProxy,
    fault_client: redis.Redis,
    fault_prefix: str,
    receiver_facade: str,
    sender_facade: str,
) -> None:
    # Given a receiver and a sender process, each on its own proxied link
    receiver = nodes.receiver(
        "r1", redis_url=make_proxy().url, facade=receiver_facade, concurrency=8
    )
    sender = nodes.sender(
        "s1", redis_url=make_proxy().url, facade=sender_facade, concurrency=16, count=200
    )
    # When the sender has made its 200 calls
    assert sender.wait(60) == 0
    # Then every call succeeded once, with its own result, and every key has a TTL
    result = check_nodes(
        nodes.nodes, name="bed-pair", redis_client=fault_client, prefix=fault_prefix
    )
    print(result.report())
    result.assert_clean(min_calls=200, min_success_rate=1.0)
    assert sum(result.executions.values()) == 200
    assert receiver.stop() == 0


@pytest.mark.parametrize("facade", ["async", "sync"])
def test_send_style_sender_gets_one_callback_per_call(
    nodes: NodeFactory, fault_client: redis.Redis, fault_prefix: str, facade: str
) -> None:
    # Given a receiver, and a sender whose callers send(...) and wait for the callback
    receiver = nodes.receiver("r1", concurrency=8)
    sender = nodes.sender("s1", facade=facade, call_style="send", concurrency=8, count=100)
    # When its 100 sends were answered
    assert sender.wait(60) == 0
    # Then every send got exactly one callback, on_response with its own echo
    result = check_nodes(
        nodes.nodes, name="bed-send", redis_client=fault_client, prefix=fault_prefix
    )
    print(result.report())
    result.assert_clean(min_calls=100, min_success_rate=1.0)
    assert sum(result.executions.values()) == 100
    assert {r["via"] for r in sender.history() if r["event"] == "end"} == {"on_response"}
    assert [r.get("unfinished_handles") for r in sender.history() if r["event"] == "stopped"] == [0]
    assert receiver.stop() == 0


def test_kill_pause_and_barrier_are_real(nodes: NodeFactory) -> None:
    # Given a receiver whose handler waits on a barrier, and one call in it
    receiver = nodes.receiver("r1", handler="barrier", concurrency=2)
    sender = nodes.sender("s1", count=2, concurrency=2, drain_timeout_s=1.0)
    receiver.wait_for("start", count=2)
    # When the barrier is released, the calls finish
    nodes.release_barriers()
    assert sender.wait(20) == 0
    assert [r["outcome"] for r in sender.history() if r["event"] == "end"] == ["ok", "ok"]
    # And pause/resume really stop and continue the process
    process = psutil.Process(receiver.pid)
    receiver.pause()
    wait_until(lambda: process.status() == psutil.STATUS_STOPPED, 5, message="stopped")
    receiver.resume()
    wait_until(lambda: process.status() != psutil.STATUS_STOPPED, 5, message="resumed")
    # And kill -9 really kills: the pid is gone, the fsync'd ledger survives
    pid = receiver.pid
    receiver.kill()
    assert receiver.returncode == -9
    assert receiver.killed_at is not None
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert [r["event"] for r in receiver.ledger()].count("start") == 2


def test_killed_receiver_after_pickup_leaves_a_start_line(nodes: NodeFactory) -> None:
    # Given a call picked up by a receiver that blocks on a barrier
    receiver = nodes.receiver("r1", handler="barrier")
    sender = nodes.sender("s1", count=1, call_deadline_s=30.0)
    receiver.wait_for("start")
    # When the receiver is killed and then the sender is killed too
    receiver.kill()
    sender.kill()
    # Then the checker sees one execution and no hung call (the sender died before its deadline)
    result = check_nodes(nodes.nodes, name="bed-kill")
    print(result.report())
    assert sum(result.executions.values()) == 1
    assert result.unfinished == 1 and result.hung == []


def test_nodes_stop_by_themselves(nodes: NodeFactory) -> None:
    # A receiver with a duration exits 0 after it
    receiver = nodes.receiver("r1", duration_s=0.5)
    # A sender whose calls cannot be served gives up after its drain timeout and says so
    sender = nodes.sender("s1", duration_s=0.5, drain_timeout_s=0.5, endpoint="poll://nobody")
    # A node past its lifetime bound is ended by its watchdog (a bound that leaves room for its
    # start-up on a slow host: 1 s did not, and it was ended before it was ready)
    forever = nodes.receiver("r2", max_lifetime_s=5.0)
    assert receiver.wait(15) == 0
    assert sender.wait(15) == EXIT_UNFINISHED
    assert forever.wait(15) == EXIT_LIFETIME
    stopped = [r for r in sender.history() if r["event"] == "stopped"]
    assert stopped and stopped[0]["unfinished"] == 1


def test_cleanup_kills_leftovers(nodes: NodeFactory) -> None:
    receiver = nodes.receiver("r1")
    receiver.pause()
    assert nodes.cleanup() == ["r1"]
    assert not receiver.alive
    assert receiver.returncode == -9


@pytest.mark.parametrize("facade", ["async", "sync"])
def test_sigterm_stops_nodes_gracefully(nodes: NodeFactory, facade: str) -> None:
    # Given a receiver and a sender that would run for a minute
    receiver = nodes.receiver("r1", facade=facade, duration_s=60.0)
    sender = nodes.sender("s1", facade=facade, duration_s=60.0, think_ms=10.0)
    sender.wait_for("end")
    # When both get SIGTERM, they stop at once, the sender after finishing its calls
    assert sender.stop() == 0
    assert receiver.stop() == 0
    history = sender.history()
    assert history[-1]["event"] == "stopped" and history[-1]["unfinished"] == 0
    result = check_nodes(nodes.nodes, name=f"bed-sigterm-{facade}")
    result.assert_clean(min_success_rate=1.0)


def test_orphaned_node_exits_by_itself(nodes: NodeFactory) -> None:
    # Given a node whose parent process exits right after starting it
    config = nodes.config("receiver", "orphan").to_json()
    spawn = (
        "import os, subprocess, sys; "
        f"env = dict(os.environ, {PARENT_PID_ENV}=str(os.getpid())); "
        "p = subprocess.Popen([sys.executable, '-m', 'tests.fault.node_main', sys.argv[1]], "
        "env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
        "print(p.pid)"
    )
    out = subprocess.run(
        [sys.executable, "-c", spawn, config],
        cwd=REPO_ROOT,
        capture_output=True,
        timeout=30,
        check=True,
    )
    pid = int(out.stdout)

    # Then the orphan notices and exits (it is reaped by whoever adopted it)
    def gone() -> bool:
        try:
            return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
        except psutil.NoSuchProcess:
            return True

    wait_until(gone, 15, message="orphaned node exited")
