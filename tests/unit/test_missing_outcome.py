"""A record found gone: DataLoss while its caller looked within the time an answer it waits for
is surely kept (QueueSettings.waited_response_ttl_s), RequestExpired after longer."""

from __future__ import annotations

import pytest

from prq import DataLoss, QueueSettings, RequestExpired
from prq.protocol.outcomes import missing_error, resolve
from prq.protocol.scripts.replies import RequestSnapshot

E, RID = "poll://gone", "gone-1"


def test_an_answer_a_caller_waits_for_outlives_its_next_poll_through_a_retry_budget() -> None:
    settings = QueueSettings(poll_interval_s=5, retry_budget_s=30)
    assert settings.waited_response_ttl_s() == 2 * 5 + 30 + 1
    # (however short the answer's own lifetime)
    assert QueueSettings(response_ttl_s=0.01, poll_interval_s=0.5).waited_response_ttl_s() > 1


@pytest.mark.parametrize("unseen_s", [None, 0.0, 40.9])
def test_a_record_gone_sooner_than_an_answer_can_expire_is_data_loss(
    unseen_s: float | None,
) -> None:
    error = missing_error(RID, E, unseen_s, 41.0)
    assert isinstance(error, DataLoss) and error.request_id == RID


@pytest.mark.parametrize("unseen_s", [41.0, 600.0])
def test_a_record_gone_after_the_caller_looked_away_that_long_may_have_expired(
    unseen_s: float,
) -> None:
    error = missing_error(RID, E, unseen_s, 41.0)
    assert isinstance(error, RequestExpired) and not isinstance(error, DataLoss)
    assert (error.request_id, error.endpoint) == (RID, E)
    assert error.retryable and error.maybe_executed
    assert "41 s" in str(error) and "expired" in str(error)


def test_resolve_without_knowing_when_it_was_seen_says_data_loss() -> None:
    with pytest.raises(DataLoss):
        resolve(RequestSnapshot(state="missing", response=b"", reason=""), RID, E)
