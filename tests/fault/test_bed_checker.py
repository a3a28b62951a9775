"""Self-tests of the checker on synthetic ledgers and histories: each anomaly is detected."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from tests.fault.checker import check

pytestmark = pytest.mark.fault

T0 = 1000.0


def start(rid: str, tag: str, t: float, node: str = "s1") -> dict[str, Any]:
    return {"event": "start", "id": rid, "tag": tag, "node": node, "t_mono": t, "deadline_s": 10.0}


def end(rid: str, tag: str, t: float, outcome: str = "ok", **extra: Any) -> dict[str, Any]:
    record = {"event": "end", "id": rid, "tag": tag, "node": "s1", "t_mono": t, "outcome": outcome}
    if outcome == "ok":
        record.update(tag_ok=extra.pop("tag_ok", True))
    return {**record, **extra}


def executed(rid: str, tag: str, t: float, node: str = "r1") -> dict[str, Any]:
    return {"event": "start", "id": rid, "node": node, "t_mono": t, "params": {"tag": tag}}


def clean_call(rid: str, t: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    return [start(rid, rid, t), end(rid, rid, t + 0.01)], executed(rid, rid, t + 0.005)


def test_clean_history_is_clean() -> None:
    history, ledger = [], []
    for n in range(10):
        records, execution = clean_call(f"c{n}", T0 + n)
        history += records
        ledger.append(execution)
    result = check([ledger], [history], name="clean", now=T0 + 100)
    result.assert_clean(min_calls=10, min_success_rate=1.0, max_p99_ms=20)
    assert result.latency_ms(0.5) == pytest.approx(10.0)
    assert "calls=10" in result.report()


def test_each_anomaly_is_detected() -> None:
    history = [
        # a duplicate: executed on two receivers
        start("dup", "dup", T0), end("dup", "dup", T0 + 1),
        # a ghost: told PickupTimeout (never ran), yet executed (even before the outcome)
        start("ghost", "ghost", T0),
        end("ghost", "ghost", T0 + 10, "PickupTimeout", maybe_executed=False, retryable=True),
        # indeterminate: ReceiverLost may have run; executed or not, it is no ghost
        start("maybe", "maybe", T0),
        end("maybe", "maybe", T0 + 6, "ReceiverLost", maybe_executed=True, retryable=True),
        # cross-talk: the result carried another call's tag
        start("xtalk", "xtalk", T0), end("xtalk", "xtalk", T0 + 1, tag_ok=False),
        # cross-talk seen by the service: the params executed under this id are another call's
        start("swap", "swap", T0), end("swap", "swap", T0 + 1),
        # hung: no end, and the sender was watched well past deadline (10 s) + grace
        start("hung", "hung", T0),
        # not hung yet: started too recently
        start("young", "young", T0 + 95),
        # a bug: not a prq error
        start("bug", "bug", T0), end("bug", "bug", T0 + 1, "KeyError", prq_error=False),
    ]  # fmt: skip
    ledger_a = [
        executed("dup", "dup", T0 + 0.1),
        executed("ghost", "ghost", T0 + 0.1),
        executed("maybe", "maybe", T0 + 0.1),
        executed("xtalk", "xtalk", T0 + 0.1),
        executed("swap", "someone-else", T0 + 0.1),
        executed("stranger", "stranger", T0 + 0.1),
    ]
    ledger_b = [executed("dup", "dup", T0 + 0.2)]
    result = check([ledger_a, ledger_b], [history], name="anomalies", now=T0 + 100)
    print(result.report())
    assert result.duplicates == {"dup": 2}
    assert result.ghosts == ["ghost"]
    assert sorted(result.cross_talk) == ["swap", "xtalk"]
    assert result.hung == ["hung"]
    assert result.unfinished == 2
    assert result.unknown_executions == ["stranger"]
    assert result.indeterminate == 1
    assert len(result.unexpected_errors) == 1
    assert result.ok_not_executed == []
    with pytest.raises(AssertionError, match=r"hung=1 .*duplicates=1 .*ghosts=1 .*cross_talk=2"):
        result.assert_clean()
    result.assert_clean(
        max_hung=1, max_duplicates=1, max_ghosts=1, max_cross_talk=2, max_unexpected_errors=1
    )


def test_hung_is_judged_until_the_sender_was_observed() -> None:
    history = [start("a", "a", T0), start("b", "b", T0, node="s2")]
    # s1 stopped cleanly at T0+20 with the call open: hung; s2 was killed at T0+1: not hung
    history.append({"event": "stopped", "node": "s1", "t_mono": T0 + 20, "unfinished": 1})
    result = check([], [history], observed_until={"s2": T0 + 1}, now=T0 + 100)
    assert result.hung == ["a"]


def test_ok_without_execution_and_success_windows() -> None:
    history = [
        start("a", "a", T0), end("a", "a", T0 + 1),
        start("b", "b", T0 + 5), end("b", "b", T0 + 6, "DataLoss", maybe_executed=True),
        start("c", "c", T0 + 10), end("c", "c", T0 + 11),
    ]  # fmt: skip
    result = check([[executed("c", "c", T0 + 10.5)]], [history], now=T0 + 100)
    assert result.ok_not_executed == ["a"]
    assert result.success_rate() == pytest.approx(2 / 3)
    assert result.success_rate(since=T0 + 7) == 1.0
    assert result.first_end("DataLoss") == T0 + 6


def test_keys_without_ttl_are_scanned(fault_client: redis.Redis) -> None:
    fault_client.set("pfx:a", "1", px=60_000)
    fault_client.set("pfx:b", "1")
    fault_client.set("other:c", "1")
    result = check([], [], redis_client=fault_client, prefix="pfx")
    assert result.keys_without_ttl == ["pfx:b"]


def test_a_second_outcome_for_one_call_is_detected() -> None:
    # a send whose callback ran twice, and one whose both callbacks ran
    history = [
        start("twice", "twice", T0), end("twice", "twice", T0 + 1), end("twice", "twice", T0 + 2),
        start("both", "both", T0),
        end("both", "both", T0 + 1),
        end("both", "both", T0 + 3, "ReceiverLost", maybe_executed=True),
        start("once", "once", T0), end("once", "once", T0 + 1),
        {"event": "stopped", "node": "s1", "t_mono": T0 + 5, "unfinished": 0,
         "unfinished_handles": 1},
    ]  # fmt: skip
    ledger = [executed(rid, rid, T0 + 0.5) for rid in ("twice", "both", "once")]
    result = check([ledger], [history], name="repeats", now=T0 + 100)
    print(result.report())
    assert result.repeated_outcomes == {"twice": 2, "both": 2}
    assert result.unfinished_handles == 1
    # the first outcome is the one the caller acted on
    assert [c.outcome for c in result.calls] == ["ok", "ok", "ok"]
    with pytest.raises(AssertionError, match=r"repeated_outcomes=2 .*unfinished_handles=1"):
        result.assert_clean()


def test_an_id_sent_again_is_a_second_call() -> None:
    # "job" answered, then sent again (another tag) after its record expired: each ran once
    history = [
        start("job", "first", T0), end("job", "first", T0 + 1),
        start("job", "second", T0 + 10), end("job", "second", T0 + 11),
    ]  # fmt: skip
    ledger = [executed("job", "first", T0 + 0.5), executed("job", "second", T0 + 10.5)]
    result = check([ledger], [history], name="again", now=T0 + 100)
    result.assert_clean(min_calls=2)
    assert [c.runs for c in result.calls] == [1, 1]
    # and the second call run with the first one's params is a duplicate of the first and
    # leaves the second unexecuted, whatever the second call's answer said
    ledger[1] = executed("job", "first", T0 + 10.5)
    result = check([ledger], [history], name="again-stale", now=T0 + 100)
    assert result.duplicates == {"job": 2}
    assert result.ok_not_executed == ["job"]


def test_at_least_once_runs_again_without_duplicates() -> None:
    history = [
        {**start("alo", "alo", T0), "delivery": "at_least_once"},
        end("alo", "alo", T0 + 8),
    ]
    ledger = [executed("alo", "alo", T0 + 0.1, node="r1"), executed("alo", "alo", T0 + 6)]
    result = check([ledger], [history], name="alo", now=T0 + 100)
    result.assert_clean()
    assert result.reruns == {"alo": 2}


def test_maybe_executed_reports_need_a_start_or_an_excuse() -> None:
    lost = {"maybe_executed": True, "retryable": True}
    history = [
        # ran, then its receiver died: honest
        start("ran", "ran", T0), end("ran", "ran", T0 + 6, "ReceiverLost", **lost),
        # held by a receiver the test killed before its handler wrote a line: honest
        start("held", "held", T0), end("held", "held", T0 + 6, "ReceiverLost", **lost),
        # never ran, nobody held it: a false alarm
        start("swallowed", "swallowed", T0),
        end("swallowed", "swallowed", T0 + 6, "ReceiverLost", **lost),
        # in flight while Redis lost data: honest DataLoss
        start("flushed", "flushed", T0 + 20),
        end("flushed", "flushed", T0 + 22, "DataLoss", **lost),
        # DataLoss long after the window: a false alarm twice over
        start("idle", "idle", T0 + 40), end("idle", "idle", T0 + 41, "DataLoss", **lost),
        # told it never ran: no "maybe" report at all
        start("timeout", "timeout", T0),
        end("timeout", "timeout", T0 + 10, "PickupTimeout", maybe_executed=False),
    ]  # fmt: skip
    ledger = [executed("ran", "ran", T0 + 0.1)]
    result = check(
        [ledger],
        [history],
        name="maybe",
        now=T0 + 100,
        picked_up={"held"},
        data_loss_windows=[(T0 + 21, T0 + 23)],
    )
    print(result.report())
    assert result.false_maybe_executed == ["swallowed", "idle"]
    assert result.false_data_loss == ["idle"]
    result.assert_clean()  # (not judged unless asked)
    with pytest.raises(AssertionError, match=r"false_maybe_executed=2 .*false_data_loss=1"):
        result.assert_clean(max_false_maybe_executed=0, max_false_data_loss=0)
