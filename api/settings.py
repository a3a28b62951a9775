"""Settings of the admin service (`ApiSettings`, environment prefix `PRQ_API_`).

Token lists and CORS origins are comma-separated in the environment
(`PRQ_API_ADMIN_TOKENS=tok1,tok2`). Tokens are `SecretStr`: they never show in a repr, a log
line or a validation error. Where Redis is and which key prefix to use are not here: they come
from prq's own settings (`PRQ_REDIS_URL`, `PRQ_PREFIX`) and are passed to `create_app`.

Example:
    ApiSettings(admin_tokens="a-long-admin-token-0001", cors_origins="https://ops.example.com")
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_PORT",
    "DEFAULT_REDIS_TIMEOUT_S",
    "DEFAULT_SAMPLE_INTERVAL_S",
    "DEFAULT_THROUGHPUT_WINDOW_S",
    "MIN_TOKEN_LENGTH",
    "ApiSettings",
]

#: Listen on loopback unless told otherwise: the service guards admin actions.
DEFAULT_HOST = "127.0.0.1"
#: The admin service's port.
DEFAULT_PORT = 8080
#: Largest request body accepted; nothing the API takes comes near it.
DEFAULT_MAX_BODY_BYTES = 64 * 1024
#: How far back the throughput chart reaches.
DEFAULT_THROUGHPUT_WINDOW_S = 600.0
#: How often the sampler reads every endpoint's enqueue counter.
DEFAULT_SAMPLE_INTERVAL_S = 2.0
#: How long a route waits for Redis before it answers 503 (health, metrics, every API read).
DEFAULT_REDIS_TIMEOUT_S = 5.0
#: Shortest token accepted: a short token can be guessed.
MIN_TOKEN_LENGTH = 16
#: Most points the sampler keeps per endpoint (window / interval), a bound on its memory.
MAX_SAMPLES_PER_ENDPOINT = 10_000


def _split(value: object) -> object:
    """A comma-separated string becomes a list of its non-empty, stripped parts."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class ApiSettings(BaseSettings):
    """How the admin service runs: tokens, address, limits, CORS, throughput sampling."""

    model_config = SettingsConfigDict(
        env_prefix="PRQ_API_", frozen=True, extra="forbid", hide_input_in_errors=True
    )

    admin_tokens: Annotated[list[SecretStr], NoDecode] = Field(default_factory=list)
    read_tokens: Annotated[list[SecretStr], NoDecode] = Field(default_factory=list)
    host: str = DEFAULT_HOST
    port: int = Field(DEFAULT_PORT, ge=1, le=65535)
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, gt=0)
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    throughput_window_s: float = Field(DEFAULT_THROUGHPUT_WINDOW_S, gt=0)
    sample_interval_s: float = Field(DEFAULT_SAMPLE_INTERVAL_S, gt=0)
    redis_timeout_s: float = Field(DEFAULT_REDIS_TIMEOUT_S, gt=0)

    @field_validator("admin_tokens", "read_tokens", "cors_origins", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        return _split(value)

    @field_validator("admin_tokens", "read_tokens")
    @classmethod
    def _token_shape(cls, tokens: list[SecretStr]) -> list[SecretStr]:
        for position, token in enumerate(tokens, start=1):
            secret = token.get_secret_value()
            # Never quote the token: the message may end up in a log.
            if len(secret) < MIN_TOKEN_LENGTH:
                raise ValueError(
                    f"token #{position} is shorter than {MIN_TOKEN_LENGTH} characters; "
                    "use a long random token (e.g. python -c 'import secrets; "
                    "print(secrets.token_urlsafe(32))')"
                )
            if not all("!" <= char <= "~" for char in secret):
                raise ValueError(
                    f"token #{position} has a character that is not visible ASCII; "
                    "a bearer token travels in an HTTP header"
                )
        return tokens

    @field_validator("cors_origins")
    @classmethod
    def _no_wildcard(cls, origins: list[str]) -> list[str]:
        for origin in origins:
            if "*" in origin:
                raise ValueError(
                    "cors_origins must list exact origins (e.g. https://ops.example.com); "
                    "a wildcard would let any web page call the admin API"
                )
            if not origin.startswith(("http://", "https://")) or origin.endswith("/"):
                raise ValueError(
                    f"CORS origin {origin!r} is not an origin: write scheme://host[:port] "
                    "without a path"
                )
        return origins

    @model_validator(mode="after")
    def _check(self) -> ApiSettings:
        admin = {token.get_secret_value() for token in self.admin_tokens}
        if any(token.get_secret_value() in admin for token in self.read_tokens):
            raise ValueError("a token is listed both as an admin and as a read token")
        if self.samples_per_endpoint > MAX_SAMPLES_PER_ENDPOINT:
            raise ValueError(
                f"throughput_window_s / sample_interval_s must be at most "
                f"{MAX_SAMPLES_PER_ENDPOINT}: sample less often or keep a shorter window"
            )
        return self

    @property
    def samples_per_endpoint(self) -> int:
        """How many samples cover the throughput window (one more than the intervals)."""
        return math.ceil(self.throughput_window_s / self.sample_interval_s) + 1
