"""Bearer tokens: 401 on every route but health and the dashboard shell without a valid token,
403 for a read token on a route that changes something; tokens never in bodies or logs."""

from __future__ import annotations

import itertools
import logging
import secrets

import httpx
import pytest

from tests.api.conftest import Tokens

pytestmark = pytest.mark.integration

#: Every route that needs a token: (method, URL).
GUARDED = [
    ("GET", "/api/whoami"),
    ("GET", "/api/endpoints"),
    ("GET", "/api/endpoint?endpoint=poll://a"),
    ("GET", "/api/queued?endpoint=poll://a"),
    ("GET", "/api/throughput"),
    ("GET", "/api/requests/0f8fad5bd9cb469fa16570867728950e"),
    ("POST", "/api/requests/0f8fad5bd9cb469fa16570867728950e/cancel"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
]
#: Routes that change something (admin only).
MUTATING = [("POST", "/api/requests/0f8fad5bd9cb469fa16570867728950e/cancel")]


def assert_unauthorized(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"]["type"] == "unauthorized"


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Bearer",
        "Bearer not-a-token-of-this-service",
        "Basic YWRtaW46YWRtaW4=",
        "Token {admin}",
        "Bearer {admin}x",
        "Bearer {admin_prefix}",
    ],
)
async def test_every_guarded_route_needs_a_valid_token(
    http: httpx.AsyncClient, tokens: Tokens, authorization: str | None
) -> None:
    # Given a request without a token, with another scheme, or with a token the service
    # does not know (even one that is a prefix or an extension of a real one)
    headers = {}
    if authorization is not None:
        headers["Authorization"] = authorization.format(
            admin=tokens.admin, admin_prefix=tokens.admin[:-1]
        )
    # When it is sent to any guarded route / Then it is refused with 401 and a Bearer challenge
    for method, url in GUARDED:
        assert_unauthorized(await http.request(method, url, headers=headers))


async def test_both_roles_pass_the_token_check_on_reads(
    http: httpx.AsyncClient, tokens: Tokens
) -> None:
    for (method, url), header in itertools.product(
        GUARDED, (tokens.admin_header, tokens.read_header)
    ):
        response = await http.request(method, url, headers=header)
        expected_forbidden = (method, url) in MUTATING and header == tokens.read_header
        if expected_forbidden:
            assert response.status_code == 403, response.text
            assert response.json()["error"]["type"] == "forbidden"
        else:
            # 404 for the made-up request id; everything else answers
            assert response.status_code in (200, 404), response.text


async def test_whoami_names_the_role(http: httpx.AsyncClient, tokens: Tokens) -> None:
    assert (await http.get("/api/whoami", headers=tokens.admin_header)).json() == {"role": "admin"}
    assert (await http.get("/api/whoami", headers=tokens.read_header)).json() == {"role": "read"}


async def test_the_dashboard_shell_and_health_need_no_token(http: httpx.AsyncClient) -> None:
    assert (await http.get("/health")).status_code == 200
    page = await http.get("/dashboard")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    asset = await http.get("/dashboard/static/app.js")
    assert asset.status_code == 200
    assert (await http.get("/dashboard/static/missing.js")).status_code == 404


async def test_tokens_never_show_in_responses_or_logs(
    http: httpx.AsyncClient, tokens: Tokens, caplog: pytest.LogCaptureFixture
) -> None:
    # Given every log record of the service captured, down to DEBUG
    for client_side in ("httpx", "httpcore"):  # the test's own client: only noise here
        caplog.set_level(logging.WARNING, logger=client_side)
    caplog.set_level(logging.DEBUG)  # last: it also sets the capturing handler's level
    wrong = f"wrong-{secrets.token_urlsafe(24)}"
    bodies: list[str] = []

    # When every route is called with the admin token, the read token and a wrong one
    for method, url in [*GUARDED, ("GET", "/health")]:
        for token in (tokens.admin, tokens.read, wrong):
            response = await http.request(method, url, headers={"Authorization": f"Bearer {token}"})
            bodies.append(response.text)
            bodies.append(str(response.headers))

    # Then no token appears in any response or any log record
    logged = caplog.text + "".join(str(r.args) for r in caplog.records)
    assert "rejected bearer token" in caplog.text  # the wrong token was logged, as an event
    for secret in (tokens.admin, tokens.read, wrong):
        assert secret not in logged
        assert not any(secret in body for body in bodies)


async def test_no_cors_headers_unless_origins_are_configured(
    http: httpx.AsyncClient, tokens: Tokens
) -> None:
    # Given the default settings (no CORS origins)
    origin = {"Origin": "https://evil.example"}
    # When a cross-origin request and a preflight arrive
    plain = await http.get("/api/whoami", headers={**origin, **tokens.read_header})
    preflight = await http.options(
        "/api/whoami",
        headers={**origin, "Access-Control-Request-Method": "GET"},
    )
    # Then neither allows any origin
    for response in (plain, preflight):
        assert "access-control-allow-origin" not in response.headers


async def test_configured_cors_origins_are_allowed_exactly(
    make_api: object, tokens: Tokens
) -> None:
    # Given a service that allows one exact origin
    assert callable(make_api)
    api = make_api(cors_origins="https://ops.example.com")
    async with httpx.AsyncClient(base_url=api.url, timeout=15) as http:
        # When that origin and another one ask
        allowed = await http.get(
            "/api/whoami",
            headers={"Origin": "https://ops.example.com", **tokens.read_header},
        )
        other = await http.get(
            "/api/whoami", headers={"Origin": "https://evil.example", **tokens.read_header}
        )
        preflight = await http.options(
            "/api/whoami",
            headers={
                "Origin": "https://ops.example.com",
                "Access-Control-Request-Method": "GET",
                "Access-Control-Request-Headers": "authorization",
            },
        )
    # Then only that origin is named, never a wildcard
    assert allowed.headers["access-control-allow-origin"] == "https://ops.example.com"
    assert "access-control-allow-origin" not in other.headers
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "https://ops.example.com"
    assert "*" not in preflight.headers.get("access-control-allow-headers", "")
