"""The dashboard: an HTML shell at `/dashboard` and its assets at `/dashboard/static/...`.

Both are served without auth: they hold no data, and the page asks for a token, which it sends
as a bearer token to the JSON routes. The assets ship inside the package (`api/static/`, no
CDN). Every response carries a strict Content-Security-Policy (scripts and styles from this
origin only, no framing), `nosniff` and `no-referrer`. Neither appears in the OpenAPI document.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI, HTTPException, status
from fastapi.responses import FileResponse
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

__all__ = ["SECURITY_HEADERS", "STATIC_DIR", "mount_dashboard"]

#: Where the packaged dashboard assets live.
STATIC_DIR = Path(__file__).resolve().parent.parent / "static"

#: Headers on every dashboard response.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


@router.get("/dashboard")
async def dashboard() -> FileResponse:
    """The dashboard page."""
    index = STATIC_DIR / "index.html"
    if not index.is_file():
        raise HTTPException(status.HTTP_404_NOT_FOUND, "the dashboard is not installed")
    return FileResponse(index, media_type="text/html; charset=utf-8", headers=SECURITY_HEADERS)


class _DashboardFiles(StaticFiles):
    """Packaged assets, with the dashboard's security headers."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(SECURITY_HEADERS)
        return response


def mount_dashboard(app: FastAPI) -> None:
    """Serve the page and its assets on `app`."""
    app.include_router(router)
    app.mount(
        "/dashboard/static",
        _DashboardFiles(directory=STATIC_DIR, check_dir=False),
        name="dashboard-static",
    )
