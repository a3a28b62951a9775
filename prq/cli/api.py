"""`prq api`: the admin service (api/, FastAPI) and its dashboard under uvicorn.

Tokens come from `PRQ_API_ADMIN_TOKENS` / `PRQ_API_READ_TOKENS` (api.settings.ApiSettings).
Without an admin token, one is generated for this run (`secrets.token_urlsafe`) and printed
once, to stderr, inside the dashboard URL (`#token=...`: a fragment, so browsers never send it
to the server and it never reaches an access log). It is never logged.

Before it listens, the command asks Redis once (a PING, bounded by `PROBE_TIMEOUT_S`): a Redis
that refuses the URL's credentials or database would leave the service unable to serve until it
is restarted, so that is `error: ConfigurationError: ...` and exit 1, as for every command. A
Redis that does not answer is no reason not to listen: the service says so on /health until it
answers.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Annotated

import typer
from pydantic import ValidationError

from prq.cli.options import (
    DEFAULT_PREFIX,
    EXIT_FAILED,
    PrefixOption,
    SharedUrlOption,
    error_line,
    fail,
    queue_settings,
    shared_redis,
)
from prq.core.config import RedisSettings
from prq.core.errors import ConfigurationError, PrqError
from prq.transport.client_options import client_kwargs
from prq.transport.topology import aclose_client, async_client
from prq.transport.translate import RedisUnavailable, translate_errors

__all__ = ["DEFAULT_GRACEFUL_SHUTDOWN_S", "PROBE_TIMEOUT_S", "api", "dashboard_url"]

#: How long uvicorn lets open requests finish after SIGINT/SIGTERM.
DEFAULT_GRACEFUL_SHUTDOWN_S = 10.0
#: Longest wait for Redis's answer to the PING before listening (no answer: listen anyway).
PROBE_TIMEOUT_S = 2.0
#: Hosts that mean "every interface": the URL printed for them names the loopback instead.
_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})  # noqa: S104 (names, not a bind)


def api(
    host: Annotated[
        str,
        typer.Option(
            "--host",
            envvar="PRQ_API_HOST",
            show_envvar=True,
            help="Address to listen on; 0.0.0.0 for every interface (in a container).",
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option(
            "--port",
            envvar="PRQ_API_PORT",
            show_envvar=True,
            min=1,
            max=65535,
            help="Port to listen on.",
        ),
    ] = 8080,
    url: SharedUrlOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
) -> None:
    """Run the admin service: health, endpoints, requests, cancel, /metrics and the dashboard.

    Bearer tokens come from PRQ_API_ADMIN_TOKENS and PRQ_API_READ_TOKENS (comma-separated, at
    least 16 characters each). With no admin token configured, one is generated for this run
    and the dashboard URL carrying it is printed once to stderr. Listens while Redis does not
    answer (/health says so); a Redis that refuses the credentials or the database is
    `error: ConfigurationError: ...` and exit 1. Needs the api extra: pip install 'prq[api]'.
    """
    redis_settings = shared_redis(url, "api")
    redis_url = redis_settings.url
    try:
        import uvicorn

        from api.app import create_app
        from api.settings import ApiSettings
    except ImportError as exc:
        typer.echo(
            f"error: prq api needs the admin service's packages: pip install 'prq[api]' "
            f"({error_line(exc)})",
            err=True,
        )
        raise typer.Exit(EXIT_FAILED) from exc
    try:
        settings = ApiSettings(host=host, port=port)
        generated: str | None = None
        if not settings.admin_tokens:
            generated = secrets.token_urlsafe(32)
            settings = ApiSettings(host=host, port=port, admin_tokens=generated)
    except ValidationError as exc:  # the settings hide the tokens from their errors
        raise typer.BadParameter(str(exc), param_hint="PRQ_API_* environment") from exc
    refused = asyncio.run(_refusal(redis_settings))
    if refused is not None:
        fail(refused)
    shown = "127.0.0.1" if host in _WILDCARD_HOSTS else host
    if generated is not None:
        typer.echo(
            "prq api: no admin token configured (PRQ_API_ADMIN_TOKENS); generated one for this "
            f"run. Dashboard: {dashboard_url(shown, port, generated)}",
            err=True,
        )
    else:
        typer.echo(
            f"prq api: dashboard at {dashboard_url(shown, port)} (sign in with an admin or "
            "read token)",
            err=True,
        )
    app = create_app(settings, redis_url=redis_url, prefix=prefix, queue_settings=queue_settings())
    # log_config=None: uvicorn logs through the root logger that `prq --verbose` configured.
    try:
        uvicorn.run(
            app,
            host=host,
            port=port,
            log_config=None,
            server_header=False,
            timeout_graceful_shutdown=int(DEFAULT_GRACEFUL_SHUTDOWN_S),
        )
    except SystemExit as exc:  # uvicorn exits 3 when it cannot start (e.g. the port is taken)
        if exc.code not in (0, None):
            raise typer.Exit(EXIT_FAILED) from exc


def dashboard_url(host: str, port: int, token: str | None = None) -> str:
    """Where the dashboard is; with `token`, in the fragment the dashboard reads it from."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    fragment = f"#token={token}" if token is not None else ""
    return f"http://{shown}:{port}/dashboard{fragment}"


async def _refusal(redis_settings: RedisSettings) -> ConfigurationError | None:
    """What Redis refuses us with (the credentials, an ACL permission, the database), asking
    once; None when it answers, or does not answer within `PROBE_TIMEOUT_S`."""
    client = async_client(redis_settings.url, client_kwargs(redis_settings))
    try:
        with translate_errors():
            await asyncio.wait_for(client.ping(), PROBE_TIMEOUT_S)
    except ConfigurationError as exc:
        return exc
    except (RedisUnavailable, PrqError):
        return None  # (the service reports it on /health while it lasts)
    finally:
        await aclose_client(client)
    return None
