"""ApiSettings: comma-separated lists from the environment, token rules, no CORS wildcard,
secrets hidden; create_app refuses to run without an admin token. (No Redis needed.)"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from api import ApiSettings, create_app
from api.auth import Role, TokenChecker
from prq.core.errors import ConfigurationError

ADMIN = "admin-token-0123456789"
ADMIN_2 = "admin-token-abcdefghij"
READ = "read-token-0123456789"


def test_token_lists_and_origins_are_comma_separated_in_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PRQ_API_ADMIN_TOKENS", f" {ADMIN} , {ADMIN_2},")
    monkeypatch.setenv("PRQ_API_READ_TOKENS", READ)
    monkeypatch.setenv("PRQ_API_CORS_ORIGINS", "https://ops.example.com,http://localhost:3000")
    monkeypatch.setenv("PRQ_API_PORT", "9090")
    settings = ApiSettings()
    assert [t.get_secret_value() for t in settings.admin_tokens] == [ADMIN, ADMIN_2]
    assert [t.get_secret_value() for t in settings.read_tokens] == [READ]
    assert settings.cors_origins == ["https://ops.example.com", "http://localhost:3000"]
    assert (settings.port, settings.host, settings.max_body_bytes) == (9090, "127.0.0.1", 65536)


def test_defaults() -> None:
    settings = ApiSettings()
    assert settings.admin_tokens == [] and settings.read_tokens == []
    assert settings.cors_origins == []
    assert (settings.throughput_window_s, settings.sample_interval_s) == (600, 2.0)
    assert settings.samples_per_endpoint == 301


def test_secrets_never_show_in_repr_or_errors() -> None:
    settings = ApiSettings(admin_tokens=[ADMIN], read_tokens=[READ])
    assert ADMIN not in repr(settings) and READ not in str(settings)
    assert ADMIN not in repr(TokenChecker(settings.admin_tokens, settings.read_tokens))
    short = "short-secret"
    with pytest.raises(ValidationError) as raised:
        ApiSettings(admin_tokens=[short])
    assert short not in str(raised.value)


@pytest.mark.parametrize(
    ("field", "value", "complaint"),
    [
        ("admin_tokens", "too-short", "shorter than 16"),
        ("read_tokens", "has a space in it, sadly", "visible ASCII"),
        ("read_tokens", "tøken-with-non-ascii", "visible ASCII"),
        ("cors_origins", "*", "wildcard"),
        ("cors_origins", "https://*.example.com", "wildcard"),
        ("cors_origins", "ops.example.com", "not an origin"),
        ("cors_origins", "https://ops.example.com/", "not an origin"),
        ("sample_interval_s", "0", "greater than 0"),
        ("max_body_bytes", "0", "greater than 0"),
    ],
)
def test_invalid_settings_are_refused(field: str, value: str, complaint: str) -> None:
    given: dict[str, Any] = {field: value}
    with pytest.raises(ValidationError, match=complaint):
        ApiSettings(**given)


def test_a_token_cannot_be_both_admin_and_read() -> None:
    with pytest.raises(ValidationError, match="both"):
        ApiSettings(admin_tokens=[ADMIN], read_tokens=[READ, ADMIN])


def test_the_throughput_buffer_is_bounded() -> None:
    with pytest.raises(ValidationError, match="at most"):
        ApiSettings(throughput_window_s=3600, sample_interval_s=0.01)


def test_create_app_needs_an_admin_token() -> None:
    with pytest.raises(ConfigurationError, match="PRQ_API_ADMIN_TOKENS"):
        create_app(ApiSettings(read_tokens=[READ]), redis_url="redis://127.0.0.1:1/0")


def test_the_token_checker_finds_each_role_and_nothing_else() -> None:
    settings = ApiSettings(admin_tokens=[ADMIN, ADMIN_2], read_tokens=[READ])
    checker = TokenChecker(settings.admin_tokens, settings.read_tokens)
    assert checker.role_of(ADMIN) is Role.ADMIN and checker.role_of(ADMIN_2) is Role.ADMIN
    assert checker.role_of(READ) is Role.READ
    for wrong in ("", ADMIN[:-1], ADMIN + "x", ADMIN.upper(), f" {READ}"):
        assert checker.role_of(wrong) is None
