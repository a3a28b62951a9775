"""Settings: where Redis is (`RedisSettings`) and how the queue behaves (`QueueSettings`).

Both read environment variables with the prefix `PRQ_` (`PRQ_REDIS_URL`, `PRQ_PICKUP_TIMEOUT_S`,
...), are frozen, and are passed around as typed objects. Defaults live in `DEFAULT_*` constants.

Example:
    settings = QueueSettings(pickup_timeout_s=10, poll_interval_s=1)
    queue = AsyncQueue.from_url("redis://localhost:6379/0", settings=settings)
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from prq.core.bounds import MIN_DURATION_S, count, duration, positive
from prq.core.defaults import (
    DATA_LOSS_CHECK_SHARE,
    DEFAULT_CANCEL_MARKER_TTL_S,
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_DATA_LOSS_CHECK_INTERVAL_S,
    DEFAULT_DEAD_LETTER_MAX,
    DEFAULT_DEAD_LETTER_TTL_S,
    DEFAULT_DEQUEUE_TIMEOUT_S,
    DEFAULT_HANDOFF_CONFIRM_S,
    DEFAULT_HEARTBEAT_INITIAL_DELAY_S,
    DEFAULT_HEARTBEAT_INTERVAL_S,
    DEFAULT_INLINE_LIMIT_BYTES,
    DEFAULT_LIST_TTL_S,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_RESPONSE_TTL_S,
    DEFAULT_PICKUP_TIMEOUT_S,
    DEFAULT_POLL_INTERVAL_S,
    DEFAULT_PULSE_INLINE_LIMIT_BYTES,
    DEFAULT_RECEIVER_TIMEOUT_S,
    DEFAULT_REDIS_URL,
    DEFAULT_REQUEST_TTL_EXTRA_S,
    DEFAULT_RESPONSE_TTL_S,
    DEFAULT_RETRY_BUDGET_S,
    DEFAULT_SENDER_TIMEOUT_S,
    DEFAULT_SHUTDOWN_TIMEOUT_S,
    DEFAULT_SIGNING_CLOCK_SKEW_S,
    DEFAULT_SOCKET_TIMEOUT_S,
    HEARTBEAT_SHARE,
    MAX_ATTEMPTS_LIMIT,
    MIN_SIGNING_KEY_LENGTH,
    SERVE_BACKOFF_MAX_S,
    UNAVAILABLE_GRACE_S,
)
from prq.core.errors import InvalidSettings, typed_validation


class RedisSettings(BaseSettings):
    """How to reach Redis. `url` comes from `PRQ_REDIS_URL` when not given."""

    model_config = SettingsConfigDict(
        env_prefix="PRQ_REDIS_", frozen=True, extra="forbid", allow_inf_nan=False
    )

    url: str = DEFAULT_REDIS_URL
    socket_timeout_s: float = duration(DEFAULT_SOCKET_TIMEOUT_S)
    connect_timeout_s: float = duration(DEFAULT_CONNECT_TIMEOUT_S)
    max_connections: int = Field(DEFAULT_MAX_CONNECTIONS, ge=2)
    #: TLS, with a `rediss://` URL: the CA bundle that signed the server's certificate (None:
    #: the system's trusted CAs).
    ssl_ca_file: str | None = None
    #: The client's certificate (PEM; may hold the key too), for a server that requires one
    #: (`tls-auth-clients yes`), and its key.
    ssl_cert_file: str | None = None
    ssl_key_file: str | None = None
    #: Check that the server's certificate names the URL's host.
    ssl_check_hostname: bool = True

    if not TYPE_CHECKING:  # (type checkers keep the fields' own signature)

        def __init__(self, **values: Any) -> None:
            # InvalidSettings (a ConfigurationError and a ValueError), not pydantic's error
            with typed_validation(InvalidSettings, "RedisSettings"):
                super().__init__(**values)

    @model_validator(mode="after")
    def _check_tls(self) -> RedisSettings:
        options = {
            "ssl_ca_file": self.ssl_ca_file,
            "ssl_cert_file": self.ssl_cert_file,
            "ssl_key_file": self.ssl_key_file,
        }
        given = [name for name, value in options.items() if value]
        if given and not self.tls:
            raise ValueError(
                f"{', '.join(given)} set, but the URL does not ask for TLS: use rediss://"
            )
        if self.ssl_key_file and not self.ssl_cert_file:
            raise ValueError("ssl_key_file set without ssl_cert_file")
        for name, value in options.items():
            if value and not Path(value).is_file():
                raise ValueError(f"{name}: no such file {value!r}")
        return self

    @property
    def tls(self) -> bool:
        """Whether the connection is TLS (a `rediss://` or `rediss+sentinel://` URL)."""
        return self.url.lower().startswith(("rediss://", "rediss+sentinel://", "rediss+cluster://"))

    @classmethod
    def from_url(cls, url: str | None = None, **overrides: float | int) -> RedisSettings:
        """Settings for `url`, or for `PRQ_REDIS_URL` (else the default) when `url` is None."""
        if url is None:
            return cls(**overrides)  # type: ignore[arg-type]
        return cls(url=url, **overrides)  # type: ignore[arg-type]

    def with_url(self, url: str | None) -> RedisSettings:
        """These settings for `url` instead of their own (themselves when `url` is None)."""
        if url is None or url == self.url:
            return self
        return RedisSettings(**{**self.model_dump(), "url": url})


class QueueSettings(BaseSettings):
    """Timings, TTLs and limits of the queue (environment prefix `PRQ_`).

    Example:
        QueueSettings(pickup_timeout_s=10, heartbeat_interval_s=1, receiver_timeout_s=5)
    """

    #: A keyword that names no field is refused (a misspelt one would be ignored silently); a
    #: PRQ_* environment variable that names none is not read.
    model_config = SettingsConfigDict(
        env_prefix="PRQ_", frozen=True, extra="forbid", allow_inf_nan=False
    )

    pickup_timeout_s: float = duration(DEFAULT_PICKUP_TIMEOUT_S)
    dequeue_timeout_s: float = duration(DEFAULT_DEQUEUE_TIMEOUT_S, zero_ok=True)
    poll_interval_s: float = duration(DEFAULT_POLL_INTERVAL_S)
    heartbeat_interval_s: float = duration(DEFAULT_HEARTBEAT_INTERVAL_S)
    heartbeat_initial_delay_s: float = duration(DEFAULT_HEARTBEAT_INITIAL_DELAY_S, zero_ok=True)
    receiver_timeout_s: float = duration(DEFAULT_RECEIVER_TIMEOUT_S)
    sender_timeout_s: float = duration(DEFAULT_SENDER_TIMEOUT_S)
    data_loss_check_interval_s: float = duration(DEFAULT_DATA_LOSS_CHECK_INTERVAL_S)
    handoff_confirm_s: float = duration(DEFAULT_HANDOFF_CONFIRM_S)
    #: Also write an id -> endpoint locator key per request, so that status and cancel by id
    #: find it in one read. Off: they ask the registered endpoints (one more round trip), and a
    #: request costs Redis no key beside its record.
    request_locators: bool = False
    retry_budget_s: float = duration(DEFAULT_RETRY_BUDGET_S, zero_ok=True)
    response_ttl_s: float = duration(DEFAULT_RESPONSE_TTL_S)
    #: A request that asks for its answer to be kept longer (Request.response_ttl_s) gets at
    #: most this, or response_ttl_s when that is longer.
    max_response_ttl_s: float = duration(DEFAULT_MAX_RESPONSE_TTL_S)
    request_ttl_extra_s: float = duration(DEFAULT_REQUEST_TTL_EXTRA_S)
    list_ttl_s: float = duration(DEFAULT_LIST_TTL_S)
    cancel_marker_ttl_s: float = duration(DEFAULT_CANCEL_MARKER_TTL_S)
    inline_limit_bytes: int = count(DEFAULT_INLINE_LIMIT_BYTES, least=1)
    max_body_bytes: int = count(DEFAULT_MAX_BODY_BYTES, least=1)
    pulse_inline_limit_bytes: int = count(DEFAULT_PULSE_INLINE_LIMIT_BYTES, least=0)
    dead_letter_ttl_s: float = duration(DEFAULT_DEAD_LETTER_TTL_S)
    dead_letter_max: int = count(DEFAULT_DEAD_LETTER_MAX, least=1)
    #: at_least_once requests enqueued by this node are handed out at most this many times.
    max_attempts: int = Field(DEFAULT_MAX_ATTEMPTS, ge=1, le=MAX_ATTEMPTS_LIMIT)
    #: Closing waits this long for held requests to be answered, then gives back the rest.
    shutdown_timeout_s: float = duration(DEFAULT_SHUTDOWN_TIMEOUT_S, zero_ok=True)
    #: Signed envelopes (prq.protocol.signing): with a key, every request and response this node
    #: writes is signed, and every one it reads must be. Never stored in Redis; give every
    #: node of a deployment the same key (at least 32 characters, e.g. `openssl rand -hex 32`).
    signing_key: SecretStr | None = None
    #: The key before a rotation: it still verifies until `signing_key_previous_until`.
    signing_key_previous: SecretStr | None = None
    signing_key_previous_until: datetime | None = None
    #: How far the nodes' clocks may differ, for signature expiry, seconds.
    signing_clock_skew_s: float = duration(DEFAULT_SIGNING_CLOCK_SKEW_S, zero_ok=True)

    if not TYPE_CHECKING:  # (type checkers keep the fields' own signature)

        def __init__(self, **values: Any) -> None:
            # InvalidSettings (a ConfigurationError and a ValueError), not pydantic's error; a
            # bad PRQ_* variable is named by its field
            with typed_validation(InvalidSettings, type(self).__name__):
                super().__init__(**values)

    @model_validator(mode="before")
    @classmethod
    def _derive(cls, data: Any) -> Any:
        """Settings left unset that follow others. Heartbeats follow the timeouts: a beat every
        quarter of the shorter timeout and the first after an eighth, at most the defaults
        (15 s and 7 s, for the default 60 s), so setting `receiver_timeout_s=5` alone is
        enough. The data-loss check interval follows `list_ttl_s`: a quarter of it, at most
        the default (60 s). A value that is not a finite positive number derives nothing (the
        field's own validation says what is wrong)."""
        if not isinstance(data, dict):
            return data
        derived: dict[str, float] = {}
        timeouts = [
            positive(data.get(name, default))
            for name, default in (
                ("receiver_timeout_s", DEFAULT_RECEIVER_TIMEOUT_S),
                ("sender_timeout_s", DEFAULT_SENDER_TIMEOUT_S),
            )
        ]
        if None not in timeouts:
            timeout = min(t for t in timeouts if t is not None)
            derived["heartbeat_interval_s"] = max(
                MIN_DURATION_S, min(DEFAULT_HEARTBEAT_INTERVAL_S, timeout / 4)
            )
            derived["heartbeat_initial_delay_s"] = min(
                DEFAULT_HEARTBEAT_INITIAL_DELAY_S, timeout / 8
            )
        list_ttl = positive(data.get("list_ttl_s", DEFAULT_LIST_TTL_S))
        if list_ttl is not None:
            derived["data_loss_check_interval_s"] = max(
                MIN_DURATION_S, min(DEFAULT_DATA_LOSS_CHECK_INTERVAL_S, list_ttl / 4)
            )
        return {name: value for name, value in derived.items() if name not in data} | data

    @model_validator(mode="after")
    def _check_limits(self) -> QueueSettings:
        if self.inline_limit_bytes > self.max_body_bytes:
            raise ValueError("inline_limit_bytes must not exceed max_body_bytes")
        self._check_signing()
        # A live node must get its first beat, and every next one, in well before the other
        # side's timeout, or it is declared dead while it works.
        timeout = min(self.receiver_timeout_s, self.sender_timeout_s)
        for name in ("heartbeat_initial_delay_s", "heartbeat_interval_s"):
            if getattr(self, name) > timeout * HEARTBEAT_SHARE:
                raise ValueError(
                    f"{name} ({getattr(self, name):g} s) must be at most half of the shorter "
                    f"of receiver_timeout_s and sender_timeout_s ({timeout:g} s): the other "
                    "side must see two beats per timeout, or one late beat gets a live node "
                    "declared dead"
                )
        if self.data_loss_check_interval_s >= self.list_ttl_s * DATA_LOSS_CHECK_SHARE:
            raise ValueError(
                f"data_loss_check_interval_s ({self.data_loss_check_interval_s:g} s) must be "
                f"below half of list_ttl_s ({self.list_ttl_s:g} s): a rollback shows in a "
                "node's canary only when it goes back past the canary's last step, so with "
                "rarer checks a Redis that went back by less than what it keeps queued could "
                "hand out again requests that ran"
            )
        return self

    def _check_signing(self) -> None:
        keys = {"signing_key": self.signing_key, "signing_key_previous": self.signing_key_previous}
        for name, key in keys.items():
            if key is not None and len(key.get_secret_value()) < MIN_SIGNING_KEY_LENGTH:
                raise ValueError(f"{name} must be at least {MIN_SIGNING_KEY_LENGTH} characters")
        if self.signing_key_previous is not None and self.signing_key is None:
            raise ValueError("signing_key_previous needs a current signing_key")
        if (self.signing_key_previous is None) != (self.signing_key_previous_until is None):
            raise ValueError(
                "signing_key_previous and signing_key_previous_until go together: the previous "
                "key verifies until that time"
            )
        until = self.signing_key_previous_until
        if until is not None and until.tzinfo is None:
            raise ValueError("signing_key_previous_until needs a time zone (e.g. ...Z)")

    def signature_ttl_s(self, pickup_timeout_s: float, attempts: int) -> float:
        """How long a signed request stays valid: as long as a legitimate delivery can still
        be taken (each attempt's pickup window, and a receiver timeout before each
        redelivery)."""
        return attempts * pickup_timeout_s + (attempts - 1) * self.receiver_timeout_s

    def signature_renewal_s(self) -> float:
        """How long a renewed request signature stays valid (prq.protocol.signing): what a request
        enqueued now would get (with this queue's pickup timeout and max attempts), plus the
        receiver timeout that passes before a silent holder's request is handed out again."""
        renewed = self.signature_ttl_s(self.pickup_timeout_s, self.max_attempts)
        return renewed + self.receiver_timeout_s

    def request_data_ttl_s(self, pickup_timeout_s: float, attempts: int) -> float:
        """How long a request's data beside Redis (DataStreams, a large body) is kept while no
        receiver holds the request (one that holds it keeps extending it): for each attempt,
        the longest it can stay queued and then in flight with its holder silent; then, dead-
        lettered, the dead-letter TTL; then a replay's time in the queue."""
        attempt_s = self.request_ttl_s(pickup_timeout_s) + self.in_flight_ttl_s()
        replay_s = self.request_ttl_s(self.pickup_timeout_s)
        return max(1, attempts) * attempt_s + self.dead_letter_ttl_s + replay_s

    def response_ttl_for(self, asked_s: float | None) -> float:
        """How long a receiver keeps the answer to a request that asked for `asked_s` seconds
        (None: nothing asked): response_ttl_s, or what was asked up to the longer of
        max_response_ttl_s and response_ttl_s."""
        if asked_s is None:
            return self.response_ttl_s
        return min(asked_s, max(self.max_response_ttl_s, self.response_ttl_s))

    def waited_response_ttl_s(self) -> float:
        """The shortest time an answer that a caller waits for is kept, whatever its request
        asked or response_ttl_s says (apply_response.lua): a caller that missed the answer's
        pulse reads it at its next poll, which may take a retry budget to get through a Redis
        blip. So a caller finds a waited-for answer gone this soon only if Redis lost it."""
        return 2 * self.poll_interval_s + self.retry_budget_s + 1.0

    def request_ttl_s(self, pickup_timeout_s: float) -> float:
        """TTL of a queued request: its pickup timeout plus the extra."""
        return pickup_timeout_s + self.request_ttl_extra_s

    def take_retry_s(self, redis: RedisSettings | None = None) -> float:
        """The longest from a take reaching Redis (its receipt written) to the next take with
        its token, when its reply never arrives: the take fails (QueueUnavailable) at most its
        retry budget, a socket timeout and a grace after it was asked; its token is kept as a
        spare (prq.node.receiver.taking), the serve loop pauses (at most SERVE_BACKOFF_MAX_S)
        and takes again with it, that take's first attempt taking a connect and a socket
        timeout at most. `redis`: the node's connection settings (None: the defaults)."""
        socket_s, connect_s = (
            (DEFAULT_SOCKET_TIMEOUT_S, DEFAULT_CONNECT_TIMEOUT_S)
            if redis is None
            else (redis.socket_timeout_s, redis.connect_timeout_s)
        )
        failed_s = self.retry_budget_s + socket_s + UNAVAILABLE_GRACE_S
        next_attempt_s = connect_s + socket_s
        return failed_s + SERVE_BACKOFF_MAX_S + next_attempt_s

    def receipt_ttl_s(self, redis: RedisSettings | None = None) -> float:
        """TTL of a take receipt (renewed by every take that reads it): it must outlive a
        take that failed until the next take of its token collects it (`take_retry_s`), a
        parked wait (a hand-off is collected by the take that follows the park, a poll
        interval later if its pulse is lost) and a hand-off's confirmation window. `redis`:
        the node's connection settings (None: the defaults); the nodes of a deployment share
        their settings, so the writer's stand for the collector's."""
        outlives = (2 * self.poll_interval_s, self.take_retry_s(redis), self.handoff_confirm_s)
        return max(outlives) + 1.0

    def in_flight_ttl_s(self) -> float:
        """TTL of a picked-up request until it is answered (heartbeats extend it)."""
        return max(self.response_ttl_s, self.receiver_timeout_s + self.request_ttl_extra_s)

    def locator_ttl_s(self, pickup_timeout_s: float) -> float:
        """TTL of a request id's locator: as long as the request can be queued, run and kept."""
        return self.request_ttl_s(pickup_timeout_s) + self.in_flight_ttl_s() + self.response_ttl_s


class _GivenValuesOnly(QueueSettings):
    """QueueSettings that reads no environment: the values given and the defaults."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def check_queue_settings(values: Mapping[str, Any]) -> QueueSettings:
    """QueueSettings from `values` and the defaults alone, no PRQ_* variable read: to check
    what a job says on one machine (a Spark driver) before it runs on others, whose own
    environment may differ. Raises ValueError naming what QueueSettings does not have, and
    InvalidSettings (a ValueError too) for a value it refuses."""
    unknown = sorted(set(values) - set(QueueSettings.model_fields))
    if unknown:
        raise ValueError(f"no such QueueSettings field {', '.join(map(repr, unknown))}")
    return _GivenValuesOnly(**values)
