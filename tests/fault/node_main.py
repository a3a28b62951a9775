"""A fault-bed node in its own OS process: `python -m tests.fault.node_main '<json config>'`.

The config (`NodeConfig`, JSON; `@path` reads it from a file) makes the process either
- a RECEIVER: `serve(endpoint, handler, concurrency=N)` with `prq.Queue` or `prq.AsyncQueue`
  (for each of its endpoints), whose handler appends to an fsync'd LEDGER (jsonl) a `start`
  line per execution (request id, node, pid, times, attempt, params), a `cancelled` line when it
  sees the request cancelled, and an `end` line; it then echoes the params, after sleeping /
  blocking its thread (or the event loop) for `handler_ms` (or the request's `sleep_ms` param),
  or after waiting for `barrier_path` to appear (`barrier` kind). A request whose params say
  `{"answer_pad": n}` gets an echo n bytes longer (an answer over a receiver's max_body_bytes);
- a SENDER: N concurrent callers (asyncio tasks or threads) that `call(endpoint, "echo",
  params={"tag": <unique>, ...}, request_id=<known up front>)` in a loop, taking its endpoints
  in turn, appending to its HISTORY (jsonl) a `start` line before each call and an `end` line
  after it (outcome class, `maybe_executed`, `retryable`, whether the result's tag is the one
  sent), and a final `stopped` line when it exits by itself. With `call_style="send"` the
  callers use `send(...)` instead: the `end` line is written by the callback (`on_response` or
  `on_failure`), one line per callback run, so a callback that ran twice, or both callbacks,
  shows as two `end` lines for one id. At_least_once calls go by `queue_and_wait` (`call` has
  no delivery of its own); `request_ids` names the ids of the first calls (to send an id again).

SWITCHES let the test idle an endpoint under running nodes: while the file
`switch_path(switch_dir, "calls-off", endpoint)` exists senders do not call that endpoint, and
while `serve-off` exists receivers stop serving it (and serve it again once it is gone).

Both write `ready_path` once their queue is started, stop by themselves after `duration_s` (or
`count` calls), stop gracefully on SIGTERM (a `plain_serve` receiver: as prq stops it), and
kill themselves if their parent disappears or
`max_lifetime_s` passes, so no node outlives its test. Time fields: `t_mono` is
`time.monotonic()` (CLOCK_MONOTONIC, comparable across processes on one machine), `t_wall` is
`time.time()`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

#: Exit status when the parent process disappeared.
EXIT_ORPHANED = 70
#: Exit status when `max_lifetime_s` passed.
EXIT_LIFETIME = 71
#: Exit status of a sender whose calls did not all finish within the drain timeout.
EXIT_UNFINISHED = 72
#: Environment variable holding the pid of the process that started the node.
PARENT_PID_ENV = "PRQ_FAULT_PARENT_PID"
#: How often the watchdog looks at the parent, and a waiting handler at its barrier, seconds.
WATCH_INTERVAL_S = 0.01
#: How often a node looks at its endpoints' switch files, seconds.
SWITCH_POLL_S = 0.05

Role = Literal["receiver", "sender"]
Facade = Literal["async", "sync"]
HandlerKind = Literal["echo", "sleep", "block", "barrier"]
CallStyle = Literal["call", "send"]
Delivery = Literal["at_most_once", "at_least_once"]
Switch = Literal["calls-off", "serve-off"]


def switch_path(switch_dir: str | Path, switch: Switch, endpoint: str) -> Path:
    """The file whose presence turns `switch` on for `endpoint` (see the module docstring)."""
    return Path(switch_dir) / f"{switch}.{quote(endpoint, safe='')}"


@dataclass
class NodeConfig:
    """Everything a node process needs (serialised to JSON for the child)."""

    role: Role
    name: str
    redis_url: str
    prefix: str
    endpoint: str
    ready_path: str
    #: Endpoints served (receiver) or called in turn (sender) beside `endpoint`.
    extra_endpoints: list[str] = field(default_factory=list)
    #: Where the endpoints' switch files are (see `switch_path`); "" for none.
    switch_dir: str = ""
    facade: Facade = "async"
    concurrency: int = 1
    #: `prq.QueueSettings` fields, e.g. {"heartbeat_interval_s": 1}.
    queue_settings: dict[str, Any] = field(default_factory=dict)
    #: `prq.RedisSettings` fields other than the URL, e.g. {"socket_timeout_s": 2}.
    redis_settings: dict[str, Any] = field(default_factory=dict)
    #: Stop by itself after this long (None: only at `count`, SIGTERM or `max_lifetime_s`).
    duration_s: float | None = None
    #: Hard bound of the process's life (the watchdog exits with EXIT_LIFETIME).
    max_lifetime_s: float = 110.0
    log_level: str = "WARNING"
    # -- receiver
    ledger_path: str = ""
    handler: HandlerKind = "echo"
    handler_ms: float = 0.0
    #: `barrier` handlers wait until this file exists.
    barrier_path: str = ""
    #: On the async facade, run the handler as a plain function in a worker thread.
    handler_in_thread: bool = False
    #: Sleeping and waiting handlers return early when the request is cancelled.
    honour_cancel: bool = True
    #: Serve `endpoint` as the README's quickstart receiver does: `serve` in the main thread
    #: with no stop of the node's own, so SIGTERM is prq's to handle (prq.serve.sigterm). Not with
    #: `duration_s`, extra endpoints or switches.
    plain_serve: bool = False
    # -- sender
    history_path: str = ""
    #: `call(...)` and wait, or `send(...)` and wait for its callback.
    call_style: CallStyle = "call"
    #: The delivery of every call.
    delivery: Delivery = "at_most_once"
    #: The request ids of the first calls, in order (fresh ones after them).
    request_ids: list[str] = field(default_factory=list)
    #: Total calls over all callers (None: until `duration_s`).
    count: int | None = None
    #: Extra params sent with every call (besides the unique "tag").
    params: dict[str, Any] = field(default_factory=dict)
    #: Pause of each caller between two calls, ms.
    think_ms: float = 0.0
    #: `timeout_s` passed to every call (None: none, as the contract's default).
    call_timeout_s: float | None = None
    #: The deadline the checker judges a call by (start + deadline + grace → hung).
    call_deadline_s: float = 60.0
    #: After the last call started, how long the sender waits for calls to finish.
    drain_timeout_s: float = 20.0
    #: If set, callers wait until this file exists before the first call.
    go_path: str = ""

    @property
    def endpoints(self) -> list[str]:
        return [self.endpoint, *self.extra_endpoints]

    def switch(self, switch: Switch, endpoint: str) -> Path | None:
        """The switch file of `endpoint`, None when the node has no switch directory."""
        return switch_path(self.switch_dir, switch, endpoint) if self.switch_dir else None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> NodeConfig:
        return cls(**json.loads(text))


class JsonlWriter:
    """Appends one JSON line per record with a single O_APPEND write (optionally fsync'd)."""

    def __init__(self, path: str, *, fsync: bool) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._fsync = fsync
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)
            if self._fsync:
                os.fsync(self._fd)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def stamp(**fields: Any) -> dict[str, Any]:
    """A record with the process id and both clocks."""
    return {**fields, "pid": os.getpid(), "t_mono": time.monotonic(), "t_wall": time.time()}


def start_watchdog(config: NodeConfig) -> None:
    """Exit hard if the parent disappears or the lifetime bound passes.

    The parent names itself in PARENT_PID_ENV: a parent that died before this process looked
    at getppid() would otherwise go unnoticed (the orphan already has a new parent).
    """
    parent = int(os.environ.get(PARENT_PID_ENV) or os.getppid())
    deadline = time.monotonic() + config.max_lifetime_s

    def watch() -> None:
        try:
            while os.getppid() == parent and time.monotonic() < deadline:
                time.sleep(WATCH_INTERVAL_S * 20)  # the watchdog's own poll interval
            with contextlib.suppress(Exception):  # stderr may be a broken pipe by now
                sys.stderr.write(f"node {config.name}: parent gone or lifetime over, exiting\n")
                sys.stderr.flush()
        finally:
            os._exit(EXIT_ORPHANED if os.getppid() != parent else EXIT_LIFETIME)

    threading.Thread(target=watch, name="watchdog", daemon=True).start()


def write_ready(config: NodeConfig) -> None:
    tmp = f"{config.ready_path}.tmp"
    Path(tmp).write_text(json.dumps({"pid": os.getpid(), "t_mono": time.monotonic()}))
    os.replace(tmp, config.ready_path)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python -m tests.fault.node_main '<json config>' | @path\n")
        return 2
    text = Path(argv[0][1:]).read_text() if argv[0].startswith("@") else argv[0]
    config = NodeConfig.from_json(text)
    logging.basicConfig(
        level=config.log_level,
        stream=sys.stderr,
        format=f"%(asctime)s {config.name} %(levelname)s %(name)s: %(message)s",
    )
    # What a node's watch loop did when a check failed or said nothing: the lines that tell
    # why a node did not declare a loss (they come only then, so they stay few).
    for name in (
        "prq.node.data_loss",
        "prq.node.watch",
        "prq.facade.asyncio_queue",
        "prq.facade.blocking_queue",
    ):
        logging.getLogger(name).setLevel(logging.DEBUG)
    start_watchdog(config)
    from tests.fault import node_roles  # after the watchdog: importing prq takes a while

    if config.role == "receiver":
        return node_roles.run_receiver(config)
    return node_roles.run_sender(config)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
