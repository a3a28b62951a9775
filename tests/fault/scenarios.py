"""What the scenario modules (test_scenario_*.py) share: the issue's timings, figures, tails.

- The timings of issue 3's scenarios are FAULT_TIMINGS (heartbeat 1 s, receiver timeout 5 s,
  sender timeout 6 s, data-loss check 1 s, poll 1 s); the constants below name the ones the
  scenarios' bounds are built from.
- `figures(name, **values)` prints one line of a scenario's own figures (next to the checker's
  `report()`), so every scenario reports what it measured in the test output.
- `hold_fault(seconds)` keeps a fault in place for its scheduled length, and `steady_for(seconds)`
  lets the load run on between two steps of a schedule. Both are the scenario's subject (Redis
  paused 5 s, a node frozen 10 s, an endpoint idle 3 s, 2 s of plain load between two faults),
  not a synchronisation: everything the test then waits for is a condition with a bound
  (`wait_until`).
- `held_by` reads which requests Redis shows picked up by a receiver; `freeze_when` freezes a
  receiver at a moment it is idle (or busy) and says what it held, so that a test killing it
  knows which callers may rightly hear "maybe executed".
- `JsonlTail` reads the records appended to a node's ledger or history since the last read.
- `request_hash` / `wait_request_state` look at one request's hash in Redis, directly.
- `ends`, `starts`, `events`: records of a node by event; `data_loss_declared`: the data-loss
  declarations a node logged (a scenario where nothing was lost expects none).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import redis

from prq.core.keys import KeySchema
from tests.fault.nodes import NodeProcess
from tests.fault.timings import FAULT_REDIS_SETTINGS, FAULT_TIMINGS
from tests.redis_servers import wait_until

__all__ = [
    "CHECK_S",
    "CONFIRM_S",
    "ENDPOINT",
    "HEARTBEAT_S",
    "POLL_DRIFT_S",
    "POLL_S",
    "RECEIVER_TIMEOUT_S",
    "SENDER_TIMEOUT_S",
    "SLACK_S",
    "SOCKET_TIMEOUT_S",
    "JsonlTail",
    "data_loss_declared",
    "ends",
    "events",
    "figures",
    "freeze_when",
    "held_by",
    "hold_fault",
    "request_hash",
    "starts",
    "steady_for",
    "wait_request_state",
]

#: The endpoint every node of the bed serves or calls (NodeFactory's default).
ENDPOINT = "poll://fault"
HEARTBEAT_S: float = FAULT_TIMINGS["heartbeat_interval_s"]
RECEIVER_TIMEOUT_S: float = FAULT_TIMINGS["receiver_timeout_s"]
SENDER_TIMEOUT_S: float = FAULT_TIMINGS["sender_timeout_s"]
CHECK_S: float = FAULT_TIMINGS["data_loss_check_interval_s"]
POLL_S: float = FAULT_TIMINGS["poll_interval_s"]
#: The hand-off confirmation window of the scenarios that shrink it (production: 2 s).
CONFIRM_S = 1.0
SOCKET_TIMEOUT_S: float = FAULT_REDIS_SETTINGS["socket_timeout_s"]
#: Slack every timing bound of the issue carries ("within X + 1 s").
SLACK_S = 1.0
#: Measurement tolerance of a bound whose "+ 1 s" is exactly one poll interval (1 s here): the
#: judging side polls on a fixed grid, so the deciding poll comes at most one interval after the
#: timeout, but its round trip (and the caller's wake-up) still takes a few ms on top. Such
#: scenarios print the raw figure and allow this much on top.
POLL_DRIFT_S = 0.1


def figures(name: str, **values: Any) -> None:
    """Print a scenario's own figures on one line (floats as seconds with 3 decimals)."""

    def show(value: Any) -> str:
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    print(f"[{name}] " + " ".join(f"{key}={show(value)}" for key, value in values.items()))


def hold_fault(seconds: float) -> None:
    """Keep the fault in place for `seconds` (its scheduled length; see the module docstring)."""
    if seconds > 0:
        time.sleep(seconds)


def steady_for(seconds: float) -> None:
    """Let the load run on for `seconds` between two steps of a schedule (module docstring)."""
    if seconds > 0:
        time.sleep(seconds)


def held_by(
    client: redis.Redis, prefix: str, node: str, endpoints: Iterable[str] = (ENDPOINT,)
) -> set[str]:
    """The requests Redis shows picked up (state taken) by receiver `node` on `endpoints`: if
    it dies now, their callers may rightly hear "maybe executed", whether or not its handler
    had written a ledger line."""
    held = set()
    for endpoint in endpoints:
        keys = KeySchema(prefix).endpoint(endpoint)
        raw_ids: list[bytes] = client.zrange(keys.running, 0, -1)  # type: ignore[assignment]
        for raw_id in raw_ids:
            request_id = raw_id.decode()
            state, receiver = client.hmget(keys.request(request_id), "st", "rcv")
            if state == b"taken" and receiver == node.encode():
                held.add(request_id)
    return held


def freeze_when(
    node: NodeProcess,
    client: redis.Redis,
    prefix: str,
    endpoints: Iterable[str] = (ENDPOINT,),
    *,
    busy: bool,
    timeout_s: float = 20.0,
) -> set[str]:
    """Freeze receiver `node` (SIGSTOP) at a moment it holds nothing (`busy` false) or holds
    something (`busy` true), and return what it holds; it stays frozen for the test to kill or
    stop. Each look freezes it until the kernel shows it stopped, then reads Redis after a PING
    of the test's own: the node's last commands reached Redis's socket before that PING was
    sent, and Redis runs what is ready in one turn of its event loop before replying, so the
    reading sees everything the node did. A node caught in the other state is resumed and
    looked at again a moment later (bounded)."""
    endpoints = list(endpoints)

    def look() -> tuple[set[str]] | None:
        node.pause()
        wait_until(lambda: node.frozen, 5.0, 0.001, f"node {node.name} stopped")
        client.ping()
        held = held_by(client, prefix, node.name, endpoints)
        if bool(held) == busy:
            return (held,)
        node.resume()
        return None

    state = "busy" if busy else "idle"
    caught: tuple[set[str]] = wait_until(look, timeout_s, 0.05, f"node {node.name} {state}")
    return caught[0]


def data_loss_declared(node: NodeProcess) -> list[str]:
    """The data-loss declarations a node logged (prq.node.data_loss warns "redis lost data ...")."""
    try:
        text = node.log_path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    return [line for line in text.splitlines() if "redis lost data" in line]


def events(node: NodeProcess, event: str) -> list[dict[str, Any]]:
    return [record for record in node.records() if record.get("event") == event]


def ok_since(senders: list[NodeProcess], since: float) -> int:
    """Calls of `senders` that ended ok at or after `since` (monotonic)."""
    return sum(
        r["outcome"] == "ok" and r["t_mono"] >= since for s in senders for r in events(s, "end")
    )


def starts(node: NodeProcess) -> list[dict[str, Any]]:
    return events(node, "start")


def ends(node: NodeProcess) -> list[dict[str, Any]]:
    return events(node, "end")


class JsonlTail:
    """The records appended to a jsonl file since the last `read()` (whole lines only)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._offset = 0
        self._partial = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as file:
                file.seek(self._offset)
                data = file.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        records = []
        for line in lines:
            if line.strip():
                records.append(json.loads(line))
        return records


def request_hash(
    client: redis.Redis, prefix: str, request_id: str, endpoint: str = ENDPOINT
) -> dict[str, str]:
    """The request's hash as Redis holds it now (empty if there is none), decoded."""
    key = KeySchema(prefix).endpoint(endpoint).request(request_id)
    raw: dict[bytes, bytes] = client.hgetall(key)  # type: ignore[assignment]
    return {k.decode(): v.decode(errors="replace") for k, v in raw.items()}


def wait_request_state(
    client: redis.Redis,
    prefix: str,
    request_id: str,
    states: tuple[str, ...],
    timeout_s: float = 10.0,
) -> dict[str, str]:
    """Wait (bounded) until the request's state is one of `states`; return its hash."""

    def reached() -> dict[str, str] | None:
        fields = request_hash(client, prefix, request_id)
        return fields if fields.get("st") in states else None

    found: dict[str, str] = wait_until(
        reached, timeout_s, 0.005, f"request {request_id} in state {states}"
    )
    return found


def shard_channels(client: Any, prefix: str) -> list[str]:
    """The shard channels of `prefix` that a cluster node's clients subscribe to (PUBSUB
    SHARDCHANNELS, on that node)."""
    return sorted(client.execute_command("PUBSUB", "SHARDCHANNELS", f"{prefix}:*"))


def owner_port(client: Any, endpoint: str) -> int:
    """The port of the cluster master that serves `endpoint` (its hash tag is the endpoint)."""
    return int(client.get_node_from_key(KeySchema("prq").endpoint(endpoint).sequence).port)


def endpoint_elsewhere(client: Any, port: int) -> str:
    """An endpoint that lives on another master than the one at `port`."""
    for i in range(1000):
        endpoint = f"poll://fault-{i}"
        if owner_port(client, endpoint) != port:
            return endpoint
    raise AssertionError("no endpoint on another master")
