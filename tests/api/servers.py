"""The admin service under a real uvicorn server on a loopback port, in a background thread.

`ApiServer(app)` binds a socket on 127.0.0.1 (port chosen by the kernel, so no race for a free
port), runs `uvicorn.Server` on it in a daemon thread with its own event loop (the app's
lifespan, and so its queue node, live on that loop), waits (bounded) for `server.started`, and
on exit asks it to stop (`should_exit`) and joins the thread (bounded).
"""

from __future__ import annotations

import socket
import threading
from types import TracebackType

import uvicorn
from fastapi import FastAPI

from tests.redis_servers import wait_until

__all__ = ["ApiServer"]

#: How long the server may take to start (lifespan included) or to stop.
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 15.0


class ApiServer:
    """One uvicorn server running `app` until the `with` block ends."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.port: int = self._socket.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_config=None,  # leave logging alone: records propagate to pytest's caplog
            lifespan="on",
            ws="none",
            timeout_graceful_shutdown=5,
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ApiServer:
        self._thread.start()
        wait_until(
            lambda: self.server.started or not self._thread.is_alive(),
            START_TIMEOUT_S,
            message="uvicorn started",
        )
        if not self.server.started:
            self._socket.close()
            raise AssertionError("the admin service did not start (see the log above)")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.server.should_exit = True
        self._thread.join(STOP_TIMEOUT_S)
        self._socket.close()
        if self._thread.is_alive():
            raise AssertionError(f"the admin service did not stop within {STOP_TIMEOUT_S} s")
