"""`prq api`: the admin service (api/, FastAPI) and its dashboard under uvicorn.

Tokens come from `PRQ_API_ADMIN_TOKENS` / `PRQ_API_READ_TOKENS` (api.settings.ApiSettings).
Without an admin token, one is generated for this run (`secrets.token_urlsafe`) and printed
once, to stderr, inside the dashboard URL (`#token=...`: a fragment, so browsers never send it
to the server and it never reaches an access log). It is never logged.
"""

from __future__ import annotations

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
    queue_settings,
    require_url,
)

__all__ = ["DEFAULT_GRACEFUL_SHUTDOWN_S", "api", "dashboard_url"]

#: How long uvicorn lets open requests finish after SIGINT/SIGTERM.
DEFAULT_GRACEFUL_SHUTDOWN_S = 10.0
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
    and the dashboard URL carrying it is printed once to stderr. Needs the api extra:
    pip install 'prq[api]'.
    """
    redis_url = require_url(url, "api")
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
