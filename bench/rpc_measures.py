"""What bench/rpc.py measures: Redis's and the processes' counters (ServerCounters), one
variant's run (Measured), a variant's runs summarised as medians (Summary), and the run's
options.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import redis


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted sequence."""
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system, all threads) used so far by process `pid`; None off Linux."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return None
    # After the command name: state is field 3, utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class ServerSnapshot:
    """Redis's counters, and the CPU time used by Redis, this process and the server process."""

    commands: int
    per_command: dict[str, int]
    redis_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    server_cpu_s: float | None = None


class ServerCounters:
    """Reads Redis's own counters; `delta` removes the INFO probes that reading them costs."""

    #: A snapshot sends INFO stats, INFO commandstats and INFO cpu; a delta covers three.
    PROBE_COMMANDS = 3

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        #: The running server process, whose CPU time snapshots include.
        self.server_pid: int | None = None

    def snapshot(self) -> ServerSnapshot:
        stats = self.client.info("stats")
        commandstats = self.client.info("commandstats")
        cpu = self.client.info("cpu")
        per_command = {
            name.removeprefix("cmdstat_"): int(value["calls"])
            for name, value in commandstats.items()
            if isinstance(value, dict)
        }
        return ServerSnapshot(
            int(stats["total_commands_processed"]),
            per_command,
            redis_cpu_s=float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
            client_cpu_s=time.process_time(),
            server_cpu_s=None if self.server_pid is None else process_cpu_s(self.server_pid),
        )

    def delta(self, before: ServerSnapshot, after: ServerSnapshot) -> ServerSnapshot:
        per_command = {
            name: calls - before.per_command.get(name, 0)
            for name, calls in after.per_command.items()
            if name != "info" and calls != before.per_command.get(name, 0)
        }
        server_cpu = None
        if before.server_cpu_s is not None and after.server_cpu_s is not None:
            server_cpu = after.server_cpu_s - before.server_cpu_s
        return ServerSnapshot(
            after.commands - before.commands - self.PROBE_COMMANDS,
            per_command,
            redis_cpu_s=after.redis_cpu_s - before.redis_cpu_s,
            client_cpu_s=after.client_cpu_s - before.client_cpu_s,
            server_cpu_s=server_cpu,
        )


@dataclass
class Measured:
    """What the phases of one variant produced."""

    variant: str
    latencies_s: list[float] = field(default_factory=list)
    throughput_elapsed_s: float = 0.0
    throughput_calls: int = 0
    seq_sender_commands: int = 0
    seq_server: ServerSnapshot | None = None
    tput_server: ServerSnapshot | None = None
    wide_elapsed_s: float = 0.0
    wide_calls: int = 0

    @property
    def p50_ms(self) -> float:
        return percentile(sorted(self.latencies_s), 0.50) * 1000

    @property
    def p99_ms(self) -> float:
        return percentile(sorted(self.latencies_s), 0.99) * 1000

    @property
    def calls_per_s(self) -> float:
        return self.throughput_calls / self.throughput_elapsed_s

    @property
    def wide_calls_per_s(self) -> float:
        return self.wide_calls / self.wide_elapsed_s if self.wide_elapsed_s else 0.0

    @property
    def sender_per_call(self) -> float:
        return self.seq_sender_commands / len(self.latencies_s)

    def _phase(self, phase: str) -> tuple[ServerSnapshot, int]:
        snap = self.seq_server if phase == "seq" else self.tput_server
        calls = len(self.latencies_s) if phase == "seq" else self.throughput_calls
        assert snap is not None
        return snap, calls

    def server_per_call(self, phase: str) -> float:
        snap, calls = self._phase(phase)
        return snap.commands / calls

    def cpu_us_per_call(self, phase: str) -> tuple[float, float | None, float]:
        """CPU microseconds per call: (sender process, server process, Redis)."""
        snap, calls = self._phase(phase)
        server = None if snap.server_cpu_s is None else snap.server_cpu_s * 1e6 / calls
        return snap.client_cpu_s * 1e6 / calls, server, snap.redis_cpu_s * 1e6 / calls


class Summary:
    """One variant over its repeats: the median of each metric (the first run's breakdown)."""

    def __init__(self, runs: Sequence[Measured]) -> None:
        self.runs = list(runs)
        self.first = self.runs[0]

    def _median(self, metric: Callable[[Measured], float]) -> float:
        return statistics.median(metric(run) for run in self.runs)

    @property
    def p50_ms(self) -> float:
        return self._median(lambda run: run.p50_ms)

    @property
    def p99_ms(self) -> float:
        return self._median(lambda run: run.p99_ms)

    @property
    def calls_per_s(self) -> float:
        return self._median(lambda run: run.calls_per_s)

    @property
    def wide_calls_per_s(self) -> float:
        return self._median(lambda run: run.wide_calls_per_s)

    @property
    def sender_per_call(self) -> float:
        return self._median(lambda run: run.sender_per_call)

    def server_per_call(self, phase: str) -> float:
        return self._median(lambda run: run.server_per_call(phase))

    def cpu_us_per_call(self, phase: str) -> tuple[float, float | None, float]:
        per_run = [run.cpu_us_per_call(phase) for run in self.runs]
        servers = [server for _, server, _ in per_run if server is not None]
        return (
            statistics.median(sender for sender, _, _ in per_run),
            statistics.median(servers) if len(servers) == len(per_run) else None,
            statistics.median(redis_cpu for _, _, redis_cpu in per_run),
        )


@dataclass(frozen=True, slots=True)
class Options:
    url: str
    calls: int
    seq_calls: int
    warmup: int
    inflight: int
    variants: tuple[str, ...]
    markdown: bool
    prefix: str
    repeat: int = 1
    #: Calls in flight in the second throughput phase (0: none).
    wide_inflight: int = 256


def _request_json(i: int) -> tuple[str, bytes]:
    rid = uuid.uuid4().hex
    return rid, json.dumps({"id": rid, "method": "echo", "params": {"i": i}}).encode()
