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

from prq.core.errors import InvalidSettings, typed_validation

#: Where to connect when neither an argument nor PRQ_REDIS_URL says otherwise.
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
#: How long a request may wait for a receiver to pick it up.
DEFAULT_PICKUP_TIMEOUT_S = 120.0
#: How long one `dequeue` waits for work before returning None.
DEFAULT_DEQUEUE_TIMEOUT_S = 30.0
#: How often a wait that listens for a pulse also polls Redis (pulses can be lost).
DEFAULT_POLL_INTERVAL_S = 5.0
#: Heartbeat rate for both roles while a picked-up request is in flight.
DEFAULT_HEARTBEAT_INTERVAL_S = 15.0
#: No heartbeat before this, so fast calls cost nothing.
DEFAULT_HEARTBEAT_INITIAL_DELAY_S = 7.0
#: Receiver silent this long: the caller gets ReceiverLost.
DEFAULT_RECEIVER_TIMEOUT_S = 60.0
#: Sender silent this long: the receiver's request is cancelled (sender_lost).
DEFAULT_SENDER_TIMEOUT_S = 90.0
#: How often each node checks its canary and the enqueue counter.
DEFAULT_DATA_LOSS_CHECK_INTERVAL_S = 60.0
#: How long one Redis step is retried on connection errors before QueueUnavailable.
DEFAULT_RETRY_BUDGET_S = 30.0
#: How long a request handed straight to an idle receiver waits for that receiver to confirm
#: it before it goes to another receiver (a receiver that died while idle never confirms).
DEFAULT_HANDOFF_CONFIRM_S = 2.0
#: How long a response is kept (for pollers, and for idempotent re-enqueue of the same id).
DEFAULT_RESPONSE_TTL_S = 20 * 60.0
#: The longest a request may ask its answer to be kept (Request.response_ttl_s): a week.
DEFAULT_MAX_RESPONSE_TTL_S = 7 * 24 * 3600.0
#: Request TTL = pickup timeout + this.
DEFAULT_REQUEST_TTL_EXTRA_S = 2 * 60.0
#: TTL of an endpoint's queue keys (levels, lanes, the enqueue counter), renewed by its pushes
#: (a busy level's at most once per eighth of it).
DEFAULT_LIST_TTL_S = 24 * 3600.0
#: How long a cancel marker (or a withdrawn request's tombstone) is kept.
DEFAULT_CANCEL_MARKER_TTL_S = 15 * 60.0
#: Bodies over this go beside Redis (DataStreamStore) instead of inline.
DEFAULT_INLINE_LIMIT_BYTES = 64 * 1024
#: Bodies over this are refused before anything is written.
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
#: Responses up to this size travel inside the response pulse, saving a read.
DEFAULT_PULSE_INLINE_LIMIT_BYTES = 16 * 1024
#: How long a dead letter is kept (and its list, refreshed on every dead letter).
DEFAULT_DEAD_LETTER_TTL_S = 7 * 86400.0
#: Most dead letters kept per endpoint; the oldest go first.
DEFAULT_DEAD_LETTER_MAX = 10_000
#: How many times an at_least_once request may be handed out, by default and at most.
DEFAULT_MAX_ATTEMPTS = 3
MAX_ATTEMPTS_LIMIT = 1000
#: How long closing a queue waits for the requests it holds to be answered.
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0
#: Allowed difference between the nodes' clocks when a signature's expiry is checked.
DEFAULT_SIGNING_CLOCK_SKEW_S = 60.0
#: Shortest signing key accepted (characters).
MIN_SIGNING_KEY_LENGTH = 32
#: Per-attempt socket timeout; bounds how long one hung Redis call can block.
DEFAULT_SOCKET_TIMEOUT_S = 5.0
#: Connect timeout for a new Redis connection.
DEFAULT_CONNECT_TIMEOUT_S = 5.0
#: Connection pool size per node.
DEFAULT_MAX_CONNECTIONS = 256


class RedisSettings(BaseSettings):
    """How to reach Redis. `url` comes from `PRQ_REDIS_URL` when not given."""

    model_config = SettingsConfigDict(env_prefix="PRQ_REDIS_", frozen=True, extra="forbid")

    url: str = DEFAULT_REDIS_URL
    socket_timeout_s: float = Field(DEFAULT_SOCKET_TIMEOUT_S, gt=0)
    connect_timeout_s: float = Field(DEFAULT_CONNECT_TIMEOUT_S, gt=0)
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

    model_config = SettingsConfigDict(env_prefix="PRQ_", frozen=True, extra="ignore")

    pickup_timeout_s: float = Field(DEFAULT_PICKUP_TIMEOUT_S, gt=0)
    dequeue_timeout_s: float = Field(DEFAULT_DEQUEUE_TIMEOUT_S, ge=0)
    poll_interval_s: float = Field(DEFAULT_POLL_INTERVAL_S, gt=0)
    heartbeat_interval_s: float = Field(DEFAULT_HEARTBEAT_INTERVAL_S, gt=0)
    heartbeat_initial_delay_s: float = Field(DEFAULT_HEARTBEAT_INITIAL_DELAY_S, ge=0)
    receiver_timeout_s: float = Field(DEFAULT_RECEIVER_TIMEOUT_S, gt=0)
    sender_timeout_s: float = Field(DEFAULT_SENDER_TIMEOUT_S, gt=0)
    data_loss_check_interval_s: float = Field(DEFAULT_DATA_LOSS_CHECK_INTERVAL_S, gt=0)
    handoff_confirm_s: float = Field(DEFAULT_HANDOFF_CONFIRM_S, gt=0)
    #: Also write an id -> endpoint locator key per request, so that status and cancel by id
    #: find it in one read. Off: they ask the registered endpoints (one more round trip), and a
    #: request costs Redis no key beside its record.
    request_locators: bool = False
    retry_budget_s: float = Field(DEFAULT_RETRY_BUDGET_S, ge=0)
    response_ttl_s: float = Field(DEFAULT_RESPONSE_TTL_S, gt=0)
    #: A request that asks for its answer to be kept longer (Request.response_ttl_s) gets at
    #: most this, or response_ttl_s when that is longer.
    max_response_ttl_s: float = Field(DEFAULT_MAX_RESPONSE_TTL_S, gt=0)
    request_ttl_extra_s: float = Field(DEFAULT_REQUEST_TTL_EXTRA_S, gt=0)
    list_ttl_s: float = Field(DEFAULT_LIST_TTL_S, gt=0)
    cancel_marker_ttl_s: float = Field(DEFAULT_CANCEL_MARKER_TTL_S, gt=0)
    inline_limit_bytes: int = Field(DEFAULT_INLINE_LIMIT_BYTES, gt=0)
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, gt=0)
    pulse_inline_limit_bytes: int = Field(DEFAULT_PULSE_INLINE_LIMIT_BYTES, ge=0)
    dead_letter_ttl_s: float = Field(DEFAULT_DEAD_LETTER_TTL_S, gt=0)
    dead_letter_max: int = Field(DEFAULT_DEAD_LETTER_MAX, ge=1)
    #: at_least_once requests enqueued by this node are handed out at most this many times.
    max_attempts: int = Field(DEFAULT_MAX_ATTEMPTS, ge=1, le=MAX_ATTEMPTS_LIMIT)
    #: Closing waits this long for held requests to be answered, then gives back the rest.
    shutdown_timeout_s: float = Field(DEFAULT_SHUTDOWN_TIMEOUT_S, ge=0)
    #: Signed envelopes (prq.protocol.signing): with a key, every request and response this node
    #: writes is signed, and every one it reads must be. Never stored in Redis; give every
    #: node of a deployment the same key (at least 32 characters, e.g. `openssl rand -hex 32`).
    signing_key: SecretStr | None = None
    #: The key before a rotation: it still verifies until `signing_key_previous_until`.
    signing_key_previous: SecretStr | None = None
    signing_key_previous_until: datetime | None = None
    #: How far the nodes' clocks may differ, for signature expiry, seconds.
    signing_clock_skew_s: float = Field(DEFAULT_SIGNING_CLOCK_SKEW_S, ge=0)

    if not TYPE_CHECKING:  # (type checkers keep the fields' own signature)

        def __init__(self, **values: Any) -> None:
            # InvalidSettings (a ConfigurationError and a ValueError), not pydantic's error; a
            # bad PRQ_* variable is named by its field
            with typed_validation(InvalidSettings, type(self).__name__):
                super().__init__(**values)

    @model_validator(mode="before")
    @classmethod
    def _derive_heartbeats(cls, data: Any) -> Any:
        """Heartbeat settings left unset follow the timeouts: a beat every quarter of the shorter
        timeout and the first after an eighth, at most the defaults (15 s and 7 s, for the
        default 60 s). So setting `receiver_timeout_s=5` alone is enough."""
        if not isinstance(data, dict):
            return data
        timeouts = []
        for name, default in (
            ("receiver_timeout_s", DEFAULT_RECEIVER_TIMEOUT_S),
            ("sender_timeout_s", DEFAULT_SENDER_TIMEOUT_S),
        ):
            try:
                timeouts.append(float(data.get(name, default)))
            except (TypeError, ValueError):
                return data  # the field's own validation says what is wrong
        timeout = min(timeouts)
        if timeout <= 0:
            return data
        derived = {
            "heartbeat_interval_s": min(DEFAULT_HEARTBEAT_INTERVAL_S, timeout / 4),
            "heartbeat_initial_delay_s": min(DEFAULT_HEARTBEAT_INITIAL_DELAY_S, timeout / 8),
        }
        return {name: value for name, value in derived.items() if name not in data} | data

    @model_validator(mode="after")
    def _check_limits(self) -> QueueSettings:
        if self.inline_limit_bytes > self.max_body_bytes:
            raise ValueError("inline_limit_bytes must not exceed max_body_bytes")
        self._check_signing()
        # A live node must get its first beat, and every next one, in before the other side's
        # timeout, or it is declared dead while it works.
        timeout = min(self.receiver_timeout_s, self.sender_timeout_s)
        for name in ("heartbeat_initial_delay_s", "heartbeat_interval_s"):
            if getattr(self, name) >= timeout:
                raise ValueError(
                    f"{name} ({getattr(self, name):g} s) must be below the receiver and sender "
                    f"timeouts ({timeout:g} s): a live node would be declared dead"
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

    def request_ttl_s(self, pickup_timeout_s: float) -> float:
        """TTL of a queued request: its pickup timeout plus the extra."""
        return pickup_timeout_s + self.request_ttl_extra_s

    def receipt_ttl_s(self) -> float:
        """TTL of a take receipt: long enough for the take's own retries, a parked wait and a
        hand-off's confirmation."""
        return max(2 * self.poll_interval_s, self.retry_budget_s, self.handoff_confirm_s) + 1.0

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
