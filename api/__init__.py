"""prq's admin service (FastAPI): health, endpoints, requests, metrics, dashboard.

`create_app(settings, redis_url=..., prefix=...)` builds the app; the caller runs it (the
`prq api` command runs it under uvicorn). See `api.app` for what it owns while it runs.
"""

from api.app import create_app
from api.settings import ApiSettings

__all__ = ["ApiSettings", "create_app"]
