"""QueueSettings: defaults, environment, and the rules that keep live nodes alive."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

import prq
from prq import InvalidSettings, PrqError, QueueSettings, RedisSettings
from prq.bulk import BulkClient
from prq.core.bounds import MAX_DURATION_S
from prq.core.errors import ConfigurationError


def test_defaults_follow_the_design() -> None:
    settings = QueueSettings()
    assert (settings.pickup_timeout_s, settings.dequeue_timeout_s) == (120, 30)
    assert (settings.heartbeat_interval_s, settings.heartbeat_initial_delay_s) == (15, 7)
    assert (settings.receiver_timeout_s, settings.sender_timeout_s) == (60, 90)
    assert settings.retry_budget_s == 30
    assert settings.response_ttl_s == 20 * 60


def test_a_request_gets_the_answer_lifetime_it_asks_for_within_the_receivers_bound() -> None:
    settings = QueueSettings(response_ttl_s=60, max_response_ttl_s=3600)
    assert settings.response_ttl_for(None) == 60  # nothing asked: the receiver's own
    assert settings.response_ttl_for(5) == 5  # shorter: as asked
    assert settings.response_ttl_for(600) == 600  # longer, within the bound: as asked
    assert settings.response_ttl_for(10**9) == 3600  # over the bound: the bound
    # A bound below the receiver's own TTL never shortens what is kept by default
    assert QueueSettings(response_ttl_s=600, max_response_ttl_s=60).response_ttl_for(10**9) == 600
    assert QueueSettings().max_response_ttl_s == 7 * 24 * 3600


def test_environment_sets_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRQ_PICKUP_TIMEOUT_S", "9")
    monkeypatch.setenv("PRQ_REDIS_URL", "redis://example.invalid:1/2")
    assert QueueSettings().pickup_timeout_s == 9
    assert RedisSettings.from_url().url == "redis://example.invalid:1/2"
    assert RedisSettings.from_url("redis://other:3/0").url == "redis://other:3/0"


def test_from_url_takes_connection_settings_beside_the_url() -> None:
    # Given connection settings made for another URL (or for PRQ_REDIS_URL)
    tuned = RedisSettings(url="redis://elsewhere:9/1", socket_timeout_s=2.5, max_connections=7)
    queue_settings = QueueSettings(pickup_timeout_s=3)

    # When a queue and a bulk client are made from a URL and those settings
    queue = prq.Queue.from_url(
        "redis://127.0.0.1:1/4", settings=queue_settings, redis_settings=tuned
    )
    client = BulkClient.from_url("redis://127.0.0.1:1/5", redis_settings=tuned)

    # Then each connects to its URL with the tuned timeouts and pool (nothing else is lost)
    assert queue.redis_settings.url == "redis://127.0.0.1:1/4"
    assert client.redis_settings.url == "redis://127.0.0.1:1/5"
    for made in (queue.redis_settings, client.redis_settings):
        assert (made.socket_timeout_s, made.max_connections) == (2.5, 7)
    assert queue.settings.pickup_timeout_s == 3
    # and without a URL the settings' own is used
    assert prq.AsyncQueue.from_url(redis_settings=tuned).redis_settings.url == tuned.url
    queue.close()
    client.close()


@pytest.mark.parametrize(
    "overrides",
    [
        {"receiver_timeout_s": 5, "heartbeat_initial_delay_s": 7},
        {"sender_timeout_s": 5, "heartbeat_initial_delay_s": 5},
        {"receiver_timeout_s": 10, "heartbeat_interval_s": 10, "heartbeat_initial_delay_s": 1},
        # (beats due within a timeout, but not twice: one late beat would kill)
        {"receiver_timeout_s": 10, "heartbeat_interval_s": 6, "heartbeat_initial_delay_s": 1},
        {"sender_timeout_s": 4, "heartbeat_interval_s": 1, "heartbeat_initial_delay_s": 2.5},
        {"inline_limit_bytes": 10, "max_body_bytes": 5},
        # a node's next data-loss check must come while it vouches for the counters
        {"data_loss_check_interval_s": 50_000},
        {"list_ttl_s": 100, "data_loss_check_interval_s": 50},
        # a count the scripts would not hold exactly
        {"dead_letter_max": 2**53},
    ],
)
def test_settings_that_would_kill_live_nodes_are_refused(overrides: dict[str, Any]) -> None:
    with pytest.raises(InvalidSettings):
        QueueSettings(**overrides)


@pytest.mark.parametrize(
    ("overrides", "interval", "first"),
    [
        ({"receiver_timeout_s": 5}, 1.25, 0.625),
        ({"sender_timeout_s": 8, "receiver_timeout_s": 40}, 2.0, 1.0),
        ({"receiver_timeout_s": 600, "sender_timeout_s": 600}, 15, 7),  # at most the defaults
        ({"receiver_timeout_s": 5, "heartbeat_interval_s": 2}, 2, 0.625),  # a given one stays
        ({"receiver_timeout_s": 5, "heartbeat_initial_delay_s": 0}, 1.25, 0),
    ],
)
def test_heartbeats_left_unset_follow_the_timeouts(
    overrides: dict[str, Any], interval: float, first: float
) -> None:
    # A shorter timeout alone is enough: the beats it needs come with it
    settings = QueueSettings(**overrides)
    assert (settings.heartbeat_interval_s, settings.heartbeat_initial_delay_s) == (interval, first)


def test_heartbeats_follow_timeouts_set_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRQ_RECEIVER_TIMEOUT_S", "8")
    assert QueueSettings().heartbeat_interval_s == 2
    monkeypatch.setenv("PRQ_HEARTBEAT_INTERVAL_S", "1")
    assert QueueSettings().heartbeat_interval_s == 1  # set, so kept
    monkeypatch.setenv("PRQ_RECEIVER_TIMEOUT_S", "soon")
    with pytest.raises(InvalidSettings, match="receiver_timeout_s"):
        QueueSettings()


def test_beats_at_half_the_shorter_timeout_are_accepted() -> None:
    settings = QueueSettings(
        receiver_timeout_s=10, sender_timeout_s=12, heartbeat_interval_s=5,
        heartbeat_initial_delay_s=5,
    )  # fmt: skip
    assert (settings.heartbeat_interval_s, settings.heartbeat_initial_delay_s) == (5, 5)


@pytest.mark.parametrize(
    ("overrides", "interval"),
    [
        ({}, 60),  # the default
        ({"list_ttl_s": 2}, 0.5),  # a quarter of a short list TTL
        ({"list_ttl_s": 2, "data_loss_check_interval_s": 0.9}, 0.9),  # a given one stays
    ],
)
def test_the_data_loss_check_interval_left_unset_follows_the_list_ttl(
    overrides: dict[str, Any], interval: float
) -> None:
    assert QueueSettings(**overrides).data_loss_check_interval_s == interval


def test_receipt_ttl_outlives_a_failed_take_and_the_next_one() -> None:
    # Given the default budgets: a take given up after 30 s of retries and a socket timeout
    # (5 s) and a grace (1 s), the serve loop's pause (at most 5 s), the next take's connect and
    # socket timeouts (5 s each)
    settings = QueueSettings(poll_interval_s=5, retry_budget_s=30)
    assert settings.take_retry_s() == 30 + 5 + 1 + 5 + 5 + 5
    assert settings.receipt_ttl_s() == settings.take_retry_s() + 1
    # And the node's own connection timeouts count
    slow = RedisSettings(socket_timeout_s=20, connect_timeout_s=10)
    assert settings.receipt_ttl_s(slow) == 30 + 20 + 1 + 5 + 10 + 20 + 1
    # And a long poll interval or hand-off window counts when it is longer
    assert QueueSettings(poll_interval_s=60, retry_budget_s=1).receipt_ttl_s() == 121
    assert QueueSettings(handoff_confirm_s=90).receipt_ttl_s() == 91


DURATIONS = (
    "pickup_timeout_s", "dequeue_timeout_s", "poll_interval_s", "heartbeat_interval_s",
    "heartbeat_initial_delay_s", "receiver_timeout_s", "sender_timeout_s",
    "data_loss_check_interval_s", "handoff_confirm_s", "retry_budget_s", "response_ttl_s",
    "max_response_ttl_s", "request_ttl_extra_s", "list_ttl_s", "cancel_marker_ttl_s",
    "dead_letter_ttl_s", "shutdown_timeout_s", "signing_clock_skew_s",
)  # fmt: skip


@pytest.mark.parametrize("field", DURATIONS)
@pytest.mark.parametrize(
    "value", [math.inf, -math.inf, math.nan, -1, MAX_DURATION_S * 2, 1e300, "inf", "1e400"]
)
def test_a_duration_that_is_not_finite_negative_or_too_large_is_refused(
    field: str, value: Any
) -> None:
    # (an infinite pickup timeout was accepted, and every call then raised OverflowError)
    with pytest.raises(InvalidSettings, match=field):
        QueueSettings(**{field: value})


@pytest.mark.parametrize("field", ["socket_timeout_s", "connect_timeout_s"])
@pytest.mark.parametrize("value", [math.inf, math.nan, -1, 0, 0.0001, MAX_DURATION_S * 2])
def test_a_connection_timeout_that_is_not_finite_or_out_of_range_is_refused(
    field: str, value: Any
) -> None:
    with pytest.raises(InvalidSettings, match=field):
        RedisSettings(**{field: value})


def test_a_duration_below_a_millisecond_is_refused_unless_it_may_be_none() -> None:
    # (Redis TTLs are whole milliseconds: a shorter one would round to none)
    with pytest.raises(InvalidSettings, match="list_ttl_s"):
        QueueSettings(list_ttl_s=0.0004)
    assert QueueSettings(retry_budget_s=0, heartbeat_initial_delay_s=0).retry_budget_s == 0


@pytest.mark.parametrize("timeout", [10**400, "1e400", math.inf])
def test_a_timeout_heartbeats_follow_that_is_no_number_is_refused_as_such(timeout: object) -> None:
    # (an int too large for a float raised OverflowError from the heartbeats' derivation)
    with pytest.raises(InvalidSettings, match="receiver_timeout_s"):
        QueueSettings(receiver_timeout_s=timeout)
    with pytest.raises(InvalidSettings, match="list_ttl_s"):
        QueueSettings(list_ttl_s=timeout)


def test_an_unknown_keyword_is_refused_and_an_unknown_variable_ignored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A misspelt keyword was ignored silently (the setting kept its default)
    with pytest.raises(InvalidSettings, match="pikup_timeout_s"):
        QueueSettings(pikup_timeout_s=3)  # type: ignore[call-arg]
    with pytest.raises(InvalidSettings, match="socket_timeout"):
        RedisSettings(socket_timeout=3)  # type: ignore[call-arg]
    # A PRQ_* variable that names no setting is not read (other tools share the prefix)
    monkeypatch.setenv("PRQ_PIKUP_TIMEOUT_S", "3")
    monkeypatch.setenv("PRQ_REDIS_URL", "redis://example.invalid:1/2")
    assert QueueSettings().pickup_timeout_s == 120


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: QueueSettings(pickup_timeout_s=-1), "pickup_timeout_s"),
        (lambda: QueueSettings(receiver_timeout_s="soon"), "receiver_timeout_s"),
        (lambda: RedisSettings(socket_timeout_s=0), "socket_timeout_s"),
        (lambda: RedisSettings(max_connections=1), "max_connections"),
    ],
)
def test_refused_settings_raise_a_prq_error_that_names_the_field(
    make: Callable[[], object], field: str
) -> None:
    # When a setting is refused, Then the error is prq's (a ConfigurationError), names the
    # field, keeps pydantic's details, and `except ValueError` still catches it
    with pytest.raises(InvalidSettings) as caught:
        make()
    error = caught.value
    assert isinstance(error, PrqError) and isinstance(error, ConfigurationError)
    assert isinstance(error, ValueError)
    assert str(error).startswith("invalid ") and field in str(error)
    assert [problem["loc"] for problem in error.errors()] == [(field,)]
    assert not error.retryable


def test_a_refused_secret_is_never_quoted_in_the_error() -> None:
    secret = "tiny-secret-key"
    with pytest.raises(InvalidSettings, match="signing_key") as caught:
        QueueSettings(signing_key=secret)
    assert secret not in str(caught.value) and secret not in repr(caught.value.errors())


def test_a_bad_environment_variable_raises_invalid_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PRQ_REDIS_SOCKET_TIMEOUT_S", "-3")
    with pytest.raises(InvalidSettings, match="socket_timeout_s"):
        RedisSettings()
