"""Parent-side handles of fault-bed node processes (receivers and senders, see node_main.py).

`NodeFactory(workdir, redis_url=..., prefix=..., endpoint=...)` builds nodes with shared
defaults; `factory.receiver("r1", handler="barrier", ...)` / `factory.sender("s1", count=200)`
return a started `NodeProcess` (ready file seen, bounded). A node can be `kill()`ed (SIGKILL;
the time is remembered for the checker), `pause()`d / `resume()`d (SIGSTOP / SIGCONT; `frozen`
once the stop took effect), `stop()`ped (SIGTERM, bounded, then SIGKILL) or `wait()`ed for
(bounded). `factory.cleanup()` (the fixture's teardown) kills whatever is still alive, so no
node outlives its test.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.fault.node_main import PARENT_PID_ENV, NodeConfig
from tests.redis_servers import wait_until

__all__ = ["NodeFactory", "NodeProcess", "read_jsonl"]

#: The repository root (the child imports `tests.fault.node_main` from here).
REPO_ROOT = Path(__file__).resolve().parents[2]
#: How long start() waits for a node's ready file (Python start-up plus importing prq).
START_TIMEOUT_S = 30.0
#: How long stop() waits after SIGTERM before SIGKILL.
STOP_TIMEOUT_S = 15.0
#: How long kill() waits for the process to be reaped.
REAP_TIMEOUT_S = 5.0


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Records of a jsonl file (a torn last line, from a kill mid-write, is skipped)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    records = []
    for line in text.splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            records.append(json.loads(line))
    return records


class NodeProcess:
    """One node process owned by the test."""

    def __init__(self, config: NodeConfig, workdir: Path) -> None:
        self.config = config
        self.name = config.name
        self.log_path = workdir / f"{config.name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        #: time.monotonic() when the test killed it (SIGKILL), else None.
        self.killed_at: float | None = None
        self.started_at: float | None = None

    @property
    def role(self) -> str:
        return self.config.role

    @property
    def pid(self) -> int:
        assert self.process is not None, "node not started"
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    @property
    def ledger_path(self) -> Path:
        return Path(self.config.ledger_path)

    @property
    def history_path(self) -> Path:
        return Path(self.config.history_path)

    def ledger(self) -> list[dict[str, Any]]:
        return read_jsonl(self.config.ledger_path) if self.config.ledger_path else []

    def history(self) -> list[dict[str, Any]]:
        return read_jsonl(self.config.history_path) if self.config.history_path else []

    def records(self) -> list[dict[str, Any]]:
        """The ledger of a receiver, the history of a sender."""
        return self.ledger() if self.role == "receiver" else self.history()

    def wait_for(
        self, event: str = "start", count: int = 1, timeout_s: float = 20.0
    ) -> list[dict[str, Any]]:
        """Wait (bounded) until `count` records of `event` are written; returns them.

        E.g. `receiver.wait_for("start")`: a request was picked up and its execution began.
        """

        def found() -> list[dict[str, Any]] | None:
            matching = [r for r in self.records() if r.get("event") == event]
            return matching if len(matching) >= count else None

        result: list[dict[str, Any]] = wait_until(
            found, timeout_s, 0.01, f"{count} {event!r} record(s) of node {self.name}"
        )
        return result

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def start(self, timeout_s: float = START_TIMEOUT_S) -> NodeProcess:
        """Spawn the process and wait (bounded) until it reports ready."""
        env = dict(os.environ)
        env[PARENT_PID_ENV] = str(os.getpid())
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.fault.node_main", self.config.to_json()],
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.started_at = time.monotonic()
        ready = Path(self.config.ready_path)

        def is_ready() -> bool:
            if ready.exists():
                return True
            if not self.alive:
                raise AssertionError(
                    f"node {self.name} exited with {self.returncode} before ready:\n"
                    f"{self.log_tail()}"
                )
            return False

        wait_until(is_ready, timeout_s, 0.02, f"node {self.name} ready")
        return self

    def go(self) -> None:
        """Release a sender started with a go file."""
        assert self.config.go_path, "node has no go file"
        Path(self.config.go_path).touch()

    def kill(self) -> None:
        """SIGKILL (a real crash), then reap (bounded)."""
        if self.alive:
            assert self.process is not None
            self.killed_at = time.monotonic()
            self.process.kill()
            self.process.wait(REAP_TIMEOUT_S)

    def pause(self) -> None:
        """SIGSTOP: the process freezes, its sockets stay open."""
        if self.alive:
            os.kill(self.pid, signal.SIGSTOP)

    @property
    def frozen(self) -> bool:
        """A pause() has taken effect: the kernel shows the process stopped (Linux /proc)."""
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except FileNotFoundError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")

    def resume(self) -> None:
        """SIGCONT after pause()."""
        if self.alive:
            os.kill(self.pid, signal.SIGCONT)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM (graceful), wait (bounded), then SIGKILL; returns the exit status."""
        if self.alive:
            assert self.process is not None
            self.resume()
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.returncode

    def wait(self, timeout_s: float) -> int:
        """Wait (bounded) until the process exits by itself; returns its exit status."""
        assert self.process is not None, "node not started"
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"node {self.name} still running after {timeout_s:g} s:\n{self.log_tail()}"
            ) from None

    def __repr__(self) -> str:
        pid = self.process.pid if self.process else None
        return f"NodeProcess({self.name!r}, {self.role}, pid={pid}, rc={self.returncode})"


class NodeFactory:
    """Builds node processes with shared defaults; `cleanup()` kills every one still alive."""

    def __init__(
        self,
        workdir: Path,
        *,
        redis_url: str = "",
        prefix: str = "",
        endpoint: str = "poll://fault",
        **defaults: Any,
    ) -> None:
        self.workdir = workdir
        self.defaults: dict[str, Any] = {
            "redis_url": redis_url,
            "prefix": prefix,
            "endpoint": endpoint,
            **defaults,
        }
        self.nodes: list[NodeProcess] = []

    def config(self, role: str, name: str, **overrides: Any) -> NodeConfig:
        """The config a node would get (defaults, then `overrides`; dicts are merged, and a
        None in an overriding dict removes the default: a setting left unset)."""
        fields: dict[str, Any] = {**self.defaults}
        for key in ("queue_settings", "redis_settings", "params"):
            merged = {**self.defaults.get(key, {}), **overrides.pop(key, {})}
            fields[key] = {name: value for name, value in merged.items() if value is not None}
        fields.update(overrides)
        fields.setdefault("ready_path", str(self.workdir / f"{name}.ready"))
        if role == "receiver":
            fields.setdefault("ledger_path", str(self.workdir / f"{name}.ledger.jsonl"))
            fields.setdefault("barrier_path", str(self.workdir / f"{name}.barrier"))
        else:
            fields.setdefault("history_path", str(self.workdir / f"{name}.history.jsonl"))
        if not fields["redis_url"] or not fields["prefix"]:
            raise ValueError("a node needs redis_url and prefix")
        return NodeConfig(role=role, name=name, **fields)  # type: ignore[arg-type]

    def spawn(self, role: str, name: str, *, start: bool = True, **overrides: Any) -> NodeProcess:
        if any(node.name == name for node in self.nodes):
            raise ValueError(f"node name {name!r} already used in this test")
        node = NodeProcess(self.config(role, name, **overrides), self.workdir)
        self.nodes.append(node)
        return node.start() if start else node

    def receiver(self, name: str, **overrides: Any) -> NodeProcess:
        """A started receiver node (see NodeConfig for the fields)."""
        return self.spawn("receiver", name, **overrides)

    def sender(self, name: str, **overrides: Any) -> NodeProcess:
        """A started sender node (see NodeConfig for the fields)."""
        return self.spawn("sender", name, **overrides)

    @property
    def receivers(self) -> list[NodeProcess]:
        return [node for node in self.nodes if node.role == "receiver"]

    @property
    def senders(self) -> list[NodeProcess]:
        return [node for node in self.nodes if node.role == "sender"]

    def release_barriers(self) -> None:
        """Let every `barrier` handler of every receiver return."""
        for node in self.receivers:
            Path(node.config.barrier_path).touch()

    def cleanup(self) -> list[str]:
        """Kill every node still alive; returns the names of those that were."""
        leftovers = []
        for node in self.nodes:
            if node.alive:
                leftovers.append(node.name)
                node.resume()
                node.kill()
        return leftovers
