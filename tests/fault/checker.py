"""The checker: a set/multiset pass over ledgers, histories and a final Redis scan (O(n)).

Inputs are the jsonl records the nodes write (tests/fault/node_main.py): receiver LEDGERS
(`start` per execution, `cancelled`, `end`) and sender HISTORIES (`start` and `end` per call,
`stopped` at a clean exit). A call is its request id and its tag: an id sent again (after its
record expired) is a second call, and an execution belongs to the call whose tag it carries.
Per scenario it counts:
- hung: a call with no `end` although its sender was observed past start + deadline + grace
  (observed until its `stopped` line, the time the test killed it, or now);
- duplicates: at_most_once calls executed (ledger `start`) more than once across all ledgers
  (at_least_once calls run again after a receiver loss: those are `reruns`, not counted);
- ghosts: executions of a call whose caller was told it did NOT run (an error with
  `maybe_executed` false: PickupTimeout, CancelledBeforePickup, ...), whenever the execution
  started. Errors with `maybe_executed` true are indeterminate ("may have run", Jepsen's :info)
  and are never counted against the queue, executed or not;
- cross-talk: an `ok` result whose tag is not the caller's tag, or an execution whose params'
  tag is not the tag its caller sent with that request id;
- ok_not_executed: an `ok` call that no ledger shows executed (a response from nowhere);
- repeated_outcomes: a call with more than one `end` line (a `send` whose callback ran twice,
  or whose both callbacks ran: "exactly one callback, exactly once");
- unfinished_handles: `send` handles a sender still saw running when it stopped;
- keys_without_ttl: keys under the prefix whose PTTL is -1 (a final SCAN);
- false_maybe_executed: calls told "maybe executed" (ReceiverLost, DataLoss, ...) that no
  ledger shows started, other than those a receiver held when the test killed it (`picked_up`,
  the ids the test saw taken by it) and those in flight while the test made Redis lose data
  (`data_loss_windows`, monotonic start and end);
- false_data_loss: calls that failed with DataLoss outside every data-loss window;
plus outcome counts, success rate and latency percentiles of `ok` calls. The last two are only
judged when the scenario says what it did (assert_clean's limits default to None for them):
a scenario that loses data without naming the windows would see them as false.

`check(...)` returns a `CheckResult`; scenarios print `result.report()` and call
`result.assert_clean(...)` with named thresholds.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Collection, Iterable, Sequence, Sized
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from tests.fault.nodes import NodeProcess, read_jsonl

__all__ = ["DEFAULT_GRACE_S", "Call", "CheckResult", "check", "check_nodes", "keys_without_ttl"]

#: Grace after a call's deadline before it counts as hung (the *g* of the fault bed).
DEFAULT_GRACE_S = 2.0


@dataclass
class Call:
    """One call as its sender recorded it."""

    id: str
    tag: str
    node: str
    start: float
    deadline_s: float
    end: float | None = None
    outcome: str | None = None
    maybe_executed: bool | None = None
    retryable: bool | None = None
    tag_ok: bool | None = None
    prq_error: bool = True
    message: str = ""
    delivery: str = "at_most_once"
    #: Executions (ledger `start` lines) of this call.
    runs: int = 0

    @property
    def finished(self) -> bool:
        return self.end is not None

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    @property
    def told_not_run(self) -> bool:
        """The caller was told the request never ran."""
        return self.outcome not in (None, "ok") and self.maybe_executed is False

    @property
    def latency_ms(self) -> float | None:
        return None if self.end is None else (self.end - self.start) * 1000.0

    def in_flight_during(self, start: float, end: float) -> bool:
        """The call was open at some moment of [start, end]."""
        return self.start <= end and (self.end is None or self.end >= start)


@dataclass
class CheckResult:
    """Figures of one scenario (see the module docstring)."""

    name: str
    calls: list[Call]
    executions: Counter[str]
    outcomes: Counter[str]
    hung: list[str] = field(default_factory=list)
    unfinished: int = 0
    duplicates: dict[str, int] = field(default_factory=dict)
    ghosts: list[str] = field(default_factory=list)
    cross_talk: list[str] = field(default_factory=list)
    ok_not_executed: list[str] = field(default_factory=list)
    unknown_executions: list[str] = field(default_factory=list)
    unexpected_errors: list[str] = field(default_factory=list)
    keys_without_ttl: list[str] = field(default_factory=list)
    cancelled_seen: dict[str, str | None] = field(default_factory=dict)
    repeated_outcomes: dict[str, int] = field(default_factory=dict)
    unfinished_handles: int = 0
    reruns: dict[str, int] = field(default_factory=dict)
    false_maybe_executed: list[str] = field(default_factory=list)
    false_data_loss: list[str] = field(default_factory=list)

    @property
    def finished_calls(self) -> list[Call]:
        return [call for call in self.calls if call.finished]

    @property
    def indeterminate(self) -> int:
        """Failed calls that may have run (maybe_executed true)."""
        return sum(1 for c in self.calls if not c.ok and c.finished and c.maybe_executed)

    def success_rate(self, since: float | None = None, until: float | None = None) -> float:
        """Share of finished calls that were ok, among those started in [since, until)."""
        window = [
            c
            for c in self.finished_calls
            if (since is None or c.start >= since) and (until is None or c.start < until)
        ]
        return sum(1 for c in window if c.ok) / len(window) if window else math.nan

    def latency_ms(self, quantile: float) -> float:
        """Latency of ok calls at `quantile` (0..1, nearest rank), ms; nan without ok calls."""
        values = sorted(c.latency_ms for c in self.calls if c.ok and c.latency_ms is not None)
        if not values:
            return math.nan
        rank = min(len(values) - 1, max(0, math.ceil(quantile * len(values)) - 1))
        return values[rank]

    def first_end(self, outcome: str) -> float | None:
        """Monotonic time of the earliest call end with `outcome` (e.g. "DataLoss")."""
        ends = [c.end for c in self.calls if c.outcome == outcome and c.end is not None]
        return min(ends) if ends else None

    def report(self) -> str:
        """A few lines of figures, for the test output."""
        finished = len(self.finished_calls)
        outcomes = ", ".join(f"{k}={v}" for k, v in self.outcomes.most_common())
        lines = [
            f"[{self.name}] calls={len(self.calls)} finished={finished} "
            f"executions={sum(self.executions.values())} outcomes: {outcomes or '-'}",
            f"  success={self.success_rate():.4f} indeterminate={self.indeterminate} "
            f"p50={self.latency_ms(0.5):.1f}ms p99={self.latency_ms(0.99):.1f}ms "
            f"max={self.latency_ms(1.0):.1f}ms",
            f"  hung={len(self.hung)} unfinished={self.unfinished} "
            f"duplicates={len(self.duplicates)} ghosts={len(self.ghosts)} "
            f"cross_talk={len(self.cross_talk)} ok_not_executed={len(self.ok_not_executed)} "
            f"unknown_executions={len(self.unknown_executions)} "
            f"unexpected_errors={len(self.unexpected_errors)} "
            f"keys_without_ttl={len(self.keys_without_ttl)} "
            f"cancelled_seen={len(self.cancelled_seen)} "
            f"repeated_outcomes={len(self.repeated_outcomes)} "
            f"unfinished_handles={self.unfinished_handles} reruns={len(self.reruns)} "
            f"false_maybe_executed={len(self.false_maybe_executed)} "
            f"false_data_loss={len(self.false_data_loss)}",
        ]
        for label, items in (
            ("hung", self.hung),
            ("duplicates", list(self.duplicates)),
            ("ghosts", self.ghosts),
            ("cross_talk", self.cross_talk),
            ("ok_not_executed", self.ok_not_executed),
            ("unexpected_errors", self.unexpected_errors),
            ("keys_without_ttl", self.keys_without_ttl),
            ("repeated_outcomes", list(self.repeated_outcomes)),
            ("false_maybe_executed", self.false_maybe_executed),
            ("false_data_loss", self.false_data_loss),
        ):
            if items:
                lines.append(f"  {label} e.g.: {', '.join(map(str, items[:5]))}")
        return "\n".join(lines)

    def assert_clean(
        self,
        *,
        max_hung: int = 0,
        max_duplicates: int = 0,
        max_ghosts: int = 0,
        max_cross_talk: int = 0,
        max_ok_not_executed: int = 0,
        max_unexpected_errors: int = 0,
        max_keys_without_ttl: int = 0,
        max_false_maybe_executed: int | None = None,
        max_false_data_loss: int | None = None,
        min_success_rate: float | None = None,
        max_p99_ms: float | None = None,
        min_calls: int = 1,
    ) -> None:
        """Fail (with the report) if any figure is past its threshold (None: not judged)."""
        counts: dict[str, tuple[Sized, int | None]] = {
            "hung": (self.hung, max_hung),
            "duplicates": (self.duplicates, max_duplicates),
            "ghosts": (self.ghosts, max_ghosts),
            "cross_talk": (self.cross_talk, max_cross_talk),
            "ok_not_executed": (self.ok_not_executed, max_ok_not_executed),
            "unexpected_errors": (self.unexpected_errors, max_unexpected_errors),
            "keys_without_ttl": (self.keys_without_ttl, max_keys_without_ttl),
            "repeated_outcomes": (self.repeated_outcomes, 0),
            "false_maybe_executed": (self.false_maybe_executed, max_false_maybe_executed),
            "false_data_loss": (self.false_data_loss, max_false_data_loss),
        }
        checks: list[tuple[str, float, float, bool]] = [
            ("calls", len(self.calls), min_calls, len(self.calls) >= min_calls)
        ]
        checks += [
            (k, len(v), limit, len(v) <= limit)
            for k, (v, limit) in counts.items()
            if limit is not None
        ]
        checks.append(
            ("unfinished_handles", self.unfinished_handles, 0, self.unfinished_handles == 0)
        )
        failed = [f"{name}={value} (limit {limit})" for name, value, limit, ok in checks if not ok]
        if failed:
            raise AssertionError(f"fault checker: {'; '.join(failed)}\n{self.report()}")


def keys_without_ttl(client: redis.Redis, prefix: str) -> list[str]:
    """Keys under `prefix` that never expire (PTTL -1)."""
    found = []
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        if client.pttl(key) == -1:
            found.append(key.decode() if isinstance(key, bytes) else str(key))
    return sorted(found)


@dataclass
class _Histories:
    """What the senders' histories say: calls by (id, tag), `end` lines per id, per sender the
    time it was observed until (its `stopped` line), and send handles unfinished at the stop."""

    calls: dict[tuple[str, str], Call]
    ends: Counter[tuple[str, str]]
    observed_until: dict[str, float]
    unfinished_handles: int


def _read_calls(
    histories: Iterable[Sequence[dict[str, Any]]],
    observed_until: dict[str, float],
) -> _Histories:
    calls: dict[tuple[str, str], Call] = {}
    ends: Counter[tuple[str, str]] = Counter()
    unfinished_handles = 0
    for records in histories:
        for rec in records:
            event = rec.get("event")
            if event == "start":
                calls[rec["id"], rec["tag"]] = Call(
                    id=rec["id"],
                    tag=rec["tag"],
                    node=rec["node"],
                    start=rec["t_mono"],
                    deadline_s=rec.get("deadline_s", 60.0),
                    delivery=rec.get("delivery", "at_most_once"),
                )
            elif event == "end" and (rec["id"], rec["tag"]) in calls:
                ends[rec["id"], rec["tag"]] += 1
                call = calls[rec["id"], rec["tag"]]
                if call.end is not None:
                    continue  # the first outcome is the one the caller acted on
                call.end = rec["t_mono"]
                call.outcome = rec["outcome"]
                call.maybe_executed = rec.get("maybe_executed")
                call.retryable = rec.get("retryable")
                call.tag_ok = rec.get("tag_ok")
                call.prq_error = rec.get("prq_error", True)
                call.message = rec.get("message", "")
            elif event == "stopped":
                observed_until.setdefault(rec["node"], rec["t_mono"])
                unfinished_handles += rec.get("unfinished_handles", 0)
    return _Histories(calls, ends, observed_until, unfinished_handles)


def _read_ledgers(
    ledgers: Iterable[Sequence[dict[str, Any]]],
) -> tuple[Counter[str], dict[str, list[str | None]], dict[str, str | None]]:
    """Executions per request id, the tags each execution got, and cancellations seen."""
    executions: Counter[str] = Counter()
    executed_tags: dict[str, list[str | None]] = {}
    cancelled: dict[str, str | None] = {}
    for records in ledgers:
        for rec in records:
            if rec.get("event") == "start":
                executions[rec["id"]] += 1
                params = rec.get("params")
                tag = params.get("tag") if isinstance(params, dict) else None
                executed_tags.setdefault(rec["id"], []).append(tag)
            elif rec.get("event") == "cancelled":
                cancelled[rec["id"]] = rec.get("reason")
    return executions, executed_tags, cancelled


def _attribute_runs(
    calls: Sequence[Call], executed_tags: dict[str, list[str | None]]
) -> dict[str, set[str]]:
    """Count each call's executions: those carrying its tag, and those under its id carrying
    no tag of any call with that id (cross-talk, which counts against every such call).
    Returns the tags of the calls of each id."""
    tags_by_id: dict[str, set[str]] = {}
    for call in calls:
        tags_by_id.setdefault(call.id, set()).add(call.tag)
    for call in calls:
        tags = tags_by_id[call.id]
        call.runs = sum(
            1 for tag in executed_tags.get(call.id, []) if tag == call.tag or tag not in tags
        )
    return tags_by_id


def check(
    ledgers: Iterable[Sequence[dict[str, Any]]],
    histories: Iterable[Sequence[dict[str, Any]]],
    *,
    name: str = "scenario",
    observed_until: dict[str, float] | None = None,
    grace_s: float = DEFAULT_GRACE_S,
    redis_client: redis.Redis | None = None,
    prefix: str | None = None,
    now: float | None = None,
    picked_up: Collection[str] = (),
    data_loss_windows: Sequence[tuple[float, float]] = (),
) -> CheckResult:
    """Figures of one scenario from ledger and history records (see the module docstring).

    `observed_until` maps a sender's name to the monotonic time up to which it was watched
    (e.g. when the test killed it); a sender with a `stopped` line uses that; others use `now`.
    Keys without TTL are scanned when `redis_client` and `prefix` are given. `picked_up` and
    `data_loss_windows` excuse "maybe executed" reports (see false_maybe_executed).
    """
    now = time.monotonic() if now is None else now
    read = _read_calls(histories, dict(observed_until or {}))
    calls, until = read.calls, read.observed_until
    executions, executed_tags, cancelled = _read_ledgers(ledgers)
    ordered = sorted(calls.values(), key=lambda c: c.start)
    tags_by_id = _attribute_runs(ordered, executed_tags)
    result = CheckResult(
        name=name,
        calls=ordered,
        executions=executions,
        outcomes=Counter(c.outcome or "unfinished" for c in calls.values()),
        cancelled_seen=cancelled,
    )
    result.duplicates = {
        c.id: c.runs for c in result.calls if c.runs > 1 and c.delivery == "at_most_once"
    }
    result.reruns = {
        c.id: c.runs for c in result.calls if c.runs > 1 and c.delivery != "at_most_once"
    }
    result.repeated_outcomes = {rid: n for (rid, _), n in read.ends.items() if n > 1}
    result.unfinished_handles = read.unfinished_handles
    result.unknown_executions = sorted(rid for rid in executions if rid not in tags_by_id)
    for call in result.calls:
        if not call.finished:
            result.unfinished += 1
            if until.get(call.node, now) >= call.start + call.deadline_s + grace_s:
                result.hung.append(call.id)
            continue
        executed = call.runs > 0
        if call.told_not_run and executed:
            result.ghosts.append(call.id)
        tags = tags_by_id[call.id]
        wrong_params = any(tag not in tags for tag in executed_tags.get(call.id, []))
        if (call.ok and call.tag_ok is False) or wrong_params:
            result.cross_talk.append(call.id)
        if call.ok and not executed:
            result.ok_not_executed.append(call.id)
        if not call.ok and not call.prq_error:
            result.unexpected_errors.append(f"{call.outcome}: {call.message[:80]}")
        lost = any(call.in_flight_during(*window) for window in data_loss_windows)
        if call.outcome == "DataLoss" and not lost:
            result.false_data_loss.append(call.id)
        if (
            not call.ok
            and call.maybe_executed
            and not executed
            and call.id not in picked_up
            and not lost
        ):
            result.false_maybe_executed.append(call.id)
    if redis_client is not None and prefix is not None:
        result.keys_without_ttl = keys_without_ttl(redis_client, prefix)
    return result


def check_nodes(
    nodes: Iterable[NodeProcess],
    *,
    name: str = "scenario",
    grace_s: float = DEFAULT_GRACE_S,
    redis_client: redis.Redis | None = None,
    prefix: str | None = None,
    picked_up: Collection[str] = (),
    data_loss_windows: Sequence[tuple[float, float]] = (),
) -> CheckResult:
    """`check` over the ledgers and histories of node processes (killed ones count until then)."""
    nodes = list(nodes)
    observed = {n.name: n.killed_at for n in nodes if n.role == "sender" and n.killed_at}
    return check(
        [read_jsonl(n.ledger_path) for n in nodes if n.role == "receiver"],
        [read_jsonl(n.history_path) for n in nodes if n.role == "sender"],
        name=name,
        observed_until=observed,
        grace_s=grace_s,
        redis_client=redis_client,
        prefix=prefix,
        picked_up=picked_up,
        data_loss_windows=data_loss_windows,
    )


def load(paths: Iterable[str | Path]) -> list[list[dict[str, Any]]]:
    """Records of several jsonl files (one list per file)."""
    return [read_jsonl(path) for path in paths]
