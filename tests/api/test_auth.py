"""Bearer tokens: 401 on every route but health and the dashboard shell without a valid token,
403 for a read token on a route that changes something; tokens never in bodies or logs.

The guarded routes are read from the app itself, so a route added without a token check fails
here without anyone having to remember to list it."""

from __future__ import annotations

import itertools
import logging
import re
import secrets
from typing import Any

import fastapi.routing
import httpx
import pytest
from fastapi import FastAPI

from tests.api.conftest import Tokens
from tests.api.servers import ApiServer

pytestmark = pytest.mark.integration

#: Served without a token: health (for load balancers) and the dashboard's shell and assets.
UNGUARDED_PATHS = {"/health", "/dashboard"}
UNGUARDED_MOUNTS = {"/dashboard/static"}
#: A value for every path parameter and required query parameter of a guarded route, by name.
SAMPLE_PARAMETERS = {"request_id": "0f8fad5bd9cb469fa16570867728950e", "endpoint": "poll://a"}
#: A valid JSON body for every guarded route that takes one, by (method, path without query).
SAMPLE_BODIES: dict[tuple[str, str], Any] = {
    ("PUT", "/api/endpoint/limits"): {"max_in_flight": None, "max_pending": None},
    ("POST", "/api/dead-letters/replay"): {"id": "0f8fad5bd9cb469fa16570867728950e"},
    ("POST", "/api/dead-letters/purge"): {"ids": ["0f8fad5bd9cb469fa16570867728950e"]},
}
#: Routes the list derived from the app must include (a check on the derivation itself).
KNOWN_GUARDED = [
    ("GET", "/api/whoami"),
    ("GET", "/api/endpoints"),
    ("GET", "/api/endpoint?endpoint=poll://a"),
    ("DELETE", "/api/endpoint?endpoint=poll://a"),
    ("GET", "/api/queued?endpoint=poll://a"),
    ("GET", "/api/throughput"),
    ("GET", "/api/endpoint/limits?endpoint=poll://a"),
    ("PUT", "/api/endpoint/limits?endpoint=poll://a"),
    ("GET", "/api/dead-letters?endpoint=poll://a"),
    ("POST", "/api/dead-letters/replay?endpoint=poll://a"),
    ("POST", "/api/dead-letters/purge?endpoint=poll://a"),
    ("GET", "/api/requests/0f8fad5bd9cb469fa16570867728950e"),
    ("POST", "/api/requests/0f8fad5bd9cb469fa16570867728950e/cancel"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
]


def app_routes(app: FastAPI) -> list[Any]:
    """Every route of `app` with its full path, those of included routers too (recent FastAPI
    keeps an included router as one entry of `app.routes`; `iter_route_contexts` opens it)."""
    contexts = getattr(fastapi.routing, "iter_route_contexts", None)
    return list(contexts(app.routes)) if contexts is not None else list(app.routes)


def guarded_routes(app: FastAPI) -> list[tuple[str, str]]:
    """(method, URL) of every route of `app` but health and the dashboard, with a sample value
    for each path parameter and required query parameter: a route added later is in it."""
    schema = app.openapi()["paths"]
    guarded = []
    for route in app_routes(app):
        methods = getattr(route, "methods", None)
        if methods is None:  # a mount
            assert route.path in UNGUARDED_MOUNTS, f"{route.path}: a mount this test cannot check"
            continue
        if route.path in UNGUARDED_PATHS:
            continue
        for method in sorted(set(methods) - {"HEAD", "OPTIONS"}):
            url = re.sub(r"\{(\w+)(?::\w+)?\}", lambda m: sample(m.group(1)), route.path)
            operation = schema.get(route.path, {}).get(method.lower(), {})
            query = [
                f"{p['name']}={sample(p['name'])}"
                for p in operation.get("parameters", [])
                if p["in"] == "query" and p.get("required")
            ]
            if "requestBody" in operation:
                assert (method, url) in SAMPLE_BODIES, f"{method} {url}: add it to SAMPLE_BODIES"
            guarded.append((method, url + ("?" + "&".join(query) if query else "")))
    return guarded


def sample(name: str) -> str:
    assert name in SAMPLE_PARAMETERS, f"parameter {name!r}: add a sample value to SAMPLE_PARAMETERS"
    return SAMPLE_PARAMETERS[name]


@pytest.fixture
def guarded(api: ApiServer) -> list[tuple[str, str]]:
    """Every route of the running app that needs a token."""
    return guarded_routes(api.app)


def mutating(routes: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Routes that change something (admin only): every method but GET."""
    return [(method, url) for method, url in routes if method != "GET"]


def test_the_guarded_routes_come_from_the_app(guarded: list[tuple[str, str]]) -> None:
    # The routes known today are found (so the derivation finds routes at all)...
    assert set(KNOWN_GUARDED) <= set(guarded), sorted(set(KNOWN_GUARDED) - set(guarded))
    # ...and neither health nor the dashboard is among them
    assert not [url for _, url in guarded if url.split("?")[0] in UNGUARDED_PATHS]
    assert sorted(mutating(guarded)) == [
        ("DELETE", "/api/endpoint?endpoint=poll://a"),
        ("POST", "/api/dead-letters/purge?endpoint=poll://a"),
        ("POST", "/api/dead-letters/replay?endpoint=poll://a"),
        ("POST", "/api/requests/0f8fad5bd9cb469fa16570867728950e/cancel"),
        ("PUT", "/api/endpoint/limits?endpoint=poll://a"),
    ]


async def send(
    http: httpx.AsyncClient, method: str, url: str, headers: dict[str, str]
) -> httpx.Response:
    """Call a guarded route, with its sample body if it takes one."""
    body = SAMPLE_BODIES.get((method, url.split("?")[0]))
    return await http.request(method, url, headers=headers, json=body)


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
    http: httpx.AsyncClient,
    tokens: Tokens,
    guarded: list[tuple[str, str]],
    authorization: str | None,
) -> None:
    # Given a request without a token, with another scheme, or with a token the service
    # does not know (even one that is a prefix or an extension of a real one)
    headers = {}
    if authorization is not None:
        headers["Authorization"] = authorization.format(
            admin=tokens.admin, admin_prefix=tokens.admin[:-1]
        )
    # When it is sent to any guarded route / Then it is refused with 401 and a Bearer challenge
    for method, url in guarded:
        assert_unauthorized(await send(http, method, url, headers))


async def test_both_roles_pass_the_token_check_on_reads(
    http: httpx.AsyncClient, tokens: Tokens, guarded: list[tuple[str, str]]
) -> None:
    for (method, url), header in itertools.product(
        guarded, (tokens.admin_header, tokens.read_header)
    ):
        response = await send(http, method, url, header)
        expected_forbidden = (method, url) in mutating(guarded) and header == tokens.read_header
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
    http: httpx.AsyncClient,
    tokens: Tokens,
    guarded: list[tuple[str, str]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given every log record of the service captured, down to DEBUG
    for client_side in ("httpx", "httpcore"):  # the test's own client: only noise here
        caplog.set_level(logging.WARNING, logger=client_side)
    caplog.set_level(logging.DEBUG)  # last: it also sets the capturing handler's level
    wrong = f"wrong-{secrets.token_urlsafe(24)}"
    bodies: list[str] = []

    # When every route is called with the admin token, the read token and a wrong one
    for method, url in [*guarded, ("GET", "/health")]:
        for token in (tokens.admin, tokens.read, wrong):
            response = await send(http, method, url, {"Authorization": f"Bearer {token}"})
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
