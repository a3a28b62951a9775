"""SparkQueueConfig refuses on the driver what every executor would refuse, before any job."""

from __future__ import annotations

from typing import Any

import pytest

from prq.spark import SparkQueueConfig


def config(**overrides: Any) -> SparkQueueConfig:
    fields: dict[str, Any] = {
        "url": "redis://127.0.0.1:1/0",
        "endpoint": "poll://scoring",
        "method": "score",
        "namespace": "job-1",
        "key_column": "key",
    }
    return SparkQueueConfig(**(fields | overrides))


@pytest.mark.parametrize(
    ("queue_settings", "says"),
    [
        ({"response_ttl": 5}, "no such QueueSettings field 'response_ttl'"),
        ({"retry_budget_s": "soon"}, "retry_budget_s: Input should be a valid number"),
        ({"max_attempts": 0}, "max_attempts: Input should be greater than or equal to 1"),
        (
            {"receiver_timeout_s": 5, "heartbeat_interval_s": 9},
            "heartbeat_interval_s (9 s) must be at most half of the shorter of receiver_timeout_s",
        ),
        ({"inline_limit_bytes": 10, "max_body_bytes": 5}, "inline_limit_bytes must not exceed"),
    ],
)
def test_queue_settings_the_executors_would_refuse_fail_at_once(
    queue_settings: dict[str, Any], says: str
) -> None:
    with pytest.raises(ValueError, match="queue_settings: ") as refused:
        config(queue_settings=queue_settings)
    assert says in str(refused.value)


def test_queue_settings_they_accept_pass_and_a_shorter_timeout_needs_nothing_else() -> None:
    cfg = config(queue_settings={"response_ttl_s": 5, "receiver_timeout_s": 5})
    assert cfg.queue_settings == {"response_ttl_s": 5, "receiver_timeout_s": 5}
    assert config(queue_settings=None).queue_settings is None
    assert config(queue_settings={}).queue_settings == {}


def test_the_drivers_environment_is_not_what_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    # The executors read their own PRQ_* environment; the driver checks what the job says
    monkeypatch.setenv("PRQ_RETRY_BUDGET_S", "not a number")
    assert config(queue_settings={"response_ttl_s": 5}).queue_settings == {"response_ttl_s": 5}


@pytest.mark.parametrize("bound", [0, -1.0])
def test_a_task_bound_must_be_positive_or_none(bound: float) -> None:
    with pytest.raises(ValueError, match="task_timeout_s must be positive"):
        config(task_timeout_s=bound)
    assert config(task_timeout_s=None).task_timeout_s is None
    assert config(task_timeout_s=30).task_timeout_s == 30


def test_backpressure_is_on_by_default_and_its_bound_must_be_positive_or_none() -> None:
    assert config().max_queued == 500_000
    assert config(max_queued=None).max_queued is None
    with pytest.raises(ValueError, match="max_queued must be at least 1"):
        config(max_queued=0)
