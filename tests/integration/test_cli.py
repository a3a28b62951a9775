"""The `prq` command line as real processes against a real Redis: worker, call, stats, api.

Each command runs as `python -m prq.cli ...` in a subprocess with only the `PRQ_*` variables
the test sets. Every wait is bounded: a line on a process's stderr, a process's exit, a state
in Redis.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from prq import AsyncQueue, QueueSettings, ReceiverLost, Request, RequestState
from prq.datastreams import DataStream, FileSystemStore
from prq.embedded import EmbeddedRedis, free_port
from prq.ops.inspector import Inspector
from tests.queue_facades import wait_for_state
from tests.redis_servers import async_wait_until, wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: How long a command may take to start (imports, connecting) and to stop.
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


# -- handlers the worker processes import (`tests.integration.test_cli:<name>`) -------------------


async def double(request: Request) -> object:
    """A coroutine handler: served by AsyncQueue.serve unless --sync."""
    if request.method == "fail":
        raise ValueError("asked to fail")
    return {"doubled": request.params * 2 if isinstance(request.params, int) else None}


def stream_length(request: Request) -> object:
    """The length of the request's stream "f", read from the worker's store."""
    return len(request.streams["f"].read())


def twice(request: Request) -> object:
    """The params, twice over (a large answer for a large request)."""
    return request.params * 2 if isinstance(request.params, str) else None


def blocking_double(request: Request) -> object:
    """A plain handler: served by worker threads unless --async; `sleep` blocks its thread."""
    if request.method == "sleep" and isinstance(request.params, int | float):
        time.sleep(min(float(request.params), 60.0))  # the work being done, not a wait
    return {"doubled": request.params * 2 if isinstance(request.params, int) else None}


# -- running prq ----------------------------------------------------------------------------------


class Prq:
    """One `prq` process; its stderr is read line by line as it comes."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.args = args
        self.process = subprocess.Popen(
            [sys.executable, "-m", "prq.cli", *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._new: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)
            self._new.put(line)

    def wait_for_line(self, text: str, timeout_s: float = START_TIMEOUT_S) -> str:
        """The first stderr line containing `text` (fails after `timeout_s` or on exit)."""
        for line in self.lines:
            if text in line:
                return line
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self._new.get(timeout=0.1)
            except queue.Empty:
                if self.process.poll() is not None and self._new.empty():
                    break
                continue
            if text in line:
                return line
        raise AssertionError(f"prq {self.args}: no {text!r} on stderr: {''.join(self.lines)}")

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """The exit code, once the process ended (fails after `timeout_s`)."""
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"prq {self.args} still runs after {timeout_s:g} s: {''.join(self.lines)}"
            ) from None
        self._reader.join(5)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._reader.join(5)
        assert self.process.stdout is not None
        self.process.stdout.close()
        assert self.process.stderr is not None
        self.process.stderr.close()


class PrqRunner:
    """Starts `prq` processes for one test (killed at teardown) and runs short ones."""

    def __init__(self, redis_url: str, prefix: str) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PRQ_")}
        self.env |= {
            "PRQ_REDIS_URL": redis_url,
            "PRQ_PREFIX": prefix,
            "PRQ_DATA_LOSS_CHECK_INTERVAL_S": "0.2",
            "PRQ_POLL_INTERVAL_S": "0.5",
            "PRQ_RETRY_BUDGET_S": "5",
        }
        self.started: list[Prq] = []

    def start(self, *args: str, **env: str) -> Prq:
        process = Prq(list(args), self.env | env)
        self.started.append(process)
        return process

    def run(
        self, *args: str, timeout_s: float = 60.0, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "prq.cli", *args],
            cwd=ROOT,
            env=self.env | env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def close(self) -> None:
        for process in self.started:
            process.kill()


def serve(prq: PrqRunner, handler: str, endpoint: str, *options: str) -> Prq:
    worker = prq.start("worker", f"tests.integration.test_cli:{handler}", "-e", endpoint, *options)
    worker.wait_for_line("prq worker: serving")
    return worker


# -- worker and call ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("handler", "options", "facade"),
    [
        ("double", [], "async"),
        ("blocking_double", [], "sync"),
        ("double", ["--sync"], "sync"),
        ("blocking_double", ["--async"], "async"),
    ],
)
def test_a_worker_serves_what_prq_call_sends(
    prq: PrqRunner, handler: str, options: list[str], facade: str
) -> None:
    # Given a worker serving an endpoint with a handler named MODULE:FUNCTION
    worker = serve(prq, handler, "poll://cli-served", "--concurrency", "2", *options)
    assert f"({facade}, concurrency 2 per endpoint)" in worker.lines[-1]

    # When `prq call` sends a request
    called = prq.run("call", "poll://cli-served", "double", "21")

    # Then it prints the handler's result as JSON and exits 0
    assert called.returncode == 0, called.stderr
    assert json.loads(called.stdout) == {"doubled": 42}

    # When the worker is told to stop, Then it stops cleanly
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    worker.wait_for_line("prq worker: stopped")


def test_a_worker_serves_its_metrics_when_asked(prq: PrqRunner) -> None:
    # Given a worker with its metrics endpoint on
    port = free_port()
    worker = serve(prq, "double", "poll://cli-metrics", "--metrics-port", str(port))
    worker.wait_for_line(f"metrics at http://127.0.0.1:{port}/metrics")

    # When it serves two calls
    for _ in range(2):
        assert prq.run("call", "poll://cli-metrics", "double", "1").returncode == 0

    # Then its metrics count them
    scraped = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    values = {
        (sample.name, sample.labels.get("endpoint")): sample.value
        for family in text_string_to_metric_families(scraped)
        for sample in family.samples
    }
    assert values[("prq_taken_total", "poll://cli-metrics")] == 2
    assert values[("prq_responded_total", "poll://cli-metrics")] == 2
    assert values[("prq_pickup_wait_seconds_count", "poll://cli-metrics")] == 2


def test_call_reports_failures_with_exit_codes_that_say_whether_to_retry(
    prq: PrqRunner,
) -> None:
    # Given a worker whose handler raises for method "fail"
    serve(prq, "double", "poll://cli-failing")

    # When the service raises, Then: exit 1, and the error on stderr
    raised = prq.run("call", "poll://cli-failing", "fail")
    assert raised.returncode == 1 and raised.stdout == ""
    assert raised.stderr.strip() == "error: RemoteError: ValueError: asked to fail"

    # When nobody serves the endpoint, Then: PickupTimeout, which may succeed later (exit 3)
    unserved = prq.run("call", "poll://cli-nobody", "m", "--pickup-timeout", "0.3")
    assert unserved.returncode == 3
    assert unserved.stderr.startswith("error: PickupTimeout: ")

    # When only the queue setting PRQ_PICKUP_TIMEOUT_S bounds the pickup, Then it applies
    started = time.monotonic()
    unserved = prq.run("call", "poll://cli-nobody", "m", PRQ_PICKUP_TIMEOUT_S="0.3")
    assert unserved.returncode == 3 and unserved.stderr.startswith("error: PickupTimeout: ")
    assert time.monotonic() - started < 15.0  # start-up included; the defaults are 30 s and more

    # When the params are not JSON, Then: a usage error (exit 2) before anything is sent
    bad = prq.run("call", "poll://cli-failing", "m", "{oops")
    assert bad.returncode == 2 and "not valid JSON" in bad.stderr


def test_call_with_a_count_prints_a_summary(prq: PrqRunner) -> None:
    # Given a worker with 4 slots
    serve(prq, "double", "poll://cli-many", "--concurrency", "4")

    # When 40 calls are sent, 4 at a time
    many = prq.run("call", "poll://cli-many", "double", "1", "--count", "40", "--inflight", "4")

    # Then a JSON summary says they all succeeded
    assert many.returncode == 0, many.stderr
    summary = json.loads(many.stdout)
    assert (summary["calls"], summary["ok"], summary["failed"]) == (40, 40, 0)
    assert summary["p50_ms"] is not None and summary["calls_per_s"] > 0


@pytest.mark.parametrize("facade", ["--sync", "--async"])
async def test_a_worker_reads_datastreams_from_its_directory(
    prq: PrqRunner, redis_url: str, key_prefix: str, tmp_path: Path, facade: str
) -> None:
    # Given a worker whose DataStreams directory is set in the environment
    directory = tmp_path / "streams"
    worker = prq.start(
        "worker", "tests.integration.test_cli:stream_length", "-e", "poll://cli-streams",
        facade, PRQ_DATASTREAMS_DIR=str(directory),
    )  # fmt: skip
    worker.wait_for_line("prq worker: serving")
    # When a caller sharing the directory sends it a 2 MiB stream
    store = FileSystemStore(directory)
    async with AsyncQueue.from_url(redis_url, prefix=key_prefix, datastreams=store) as caller:
        data = DataStream.from_bytes(b"x" * (2 * 1024 * 1024))
        request = Request(endpoint="poll://cli-streams", method="len", streams={"f": data})
        response = await asyncio.wait_for(caller.queue_and_wait(request), 20)
    # Then the worker read it all, and deletes its data once it answered
    assert response.result == 2 * 1024 * 1024
    await async_wait_until(
        lambda: [p for p in directory.iterdir() if not p.name.startswith(".")] == [],
        10, 0.02, "the stream's data deleted",
    )  # fmt: skip


def test_prq_call_and_a_worker_keep_large_bodies_in_their_directory(
    prq: PrqRunner, tmp_path: Path
) -> None:
    # Given a worker and `prq call` sharing a directory, with a 1 KiB inline limit
    directory = tmp_path / "bodies"
    env = {"PRQ_DATASTREAMS_DIR": str(directory), "PRQ_INLINE_LIMIT_BYTES": "1024"}
    worker = prq.start("worker", "tests.integration.test_cli:twice", "-e", "poll://cli-big", **env)
    worker.wait_for_line("prq worker: serving")
    # When a 5,000-character request is called, and answered with twice that
    called = prq.run("call", "poll://cli-big", "twice", json.dumps("a" * 5000), timeout_s=60, **env)
    # Then the answer comes back whole, and only the answer's body is left in the directory
    # (kept for the response TTL; the request's was deleted once answered)
    assert called.returncode == 0, called.stderr
    assert json.loads(called.stdout) == "a" * 10_000
    assert len([p for p in directory.iterdir() if not p.name.startswith(".")]) == 1


@pytest.mark.parametrize("facade", ["--sync", "--async"])
async def test_sigterm_lets_the_held_request_finish_then_stops(
    prq: PrqRunner, redis_url: str, key_prefix: str, facade: str
) -> None:
    # Given a worker (of either facade) handling a request that takes 1.5 s
    worker = serve(prq, "blocking_double", "poll://cli-slow", facade)
    settings = QueueSettings(pickup_timeout_s=30, poll_interval_s=0.5)
    async with AsyncQueue.from_url(redis_url, prefix=key_prefix, settings=settings) as caller:
        request = Request(endpoint="poll://cli-slow", method="sleep", params=1.5)
        call = asyncio.create_task(caller.queue_and_wait(request))
        await wait_for_state(caller, request.id, RequestState.TAKEN)

        # When it gets SIGTERM
        worker.signal(signal.SIGTERM)
        stopping = time.monotonic()

        # Then the request still gets its answer, and the worker exits 0 soon after
        response = await asyncio.wait_for(call, 10)
        assert response.result == {"doubled": None}
        code = await asyncio.to_thread(worker.wait, 10)
        assert code == 0, "".join(worker.lines)
        assert time.monotonic() - stopping < 5.0
        worker.wait_for_line("stopping: finishing held requests")


async def test_a_worker_abandons_what_outlasts_its_shutdown_timeout(
    prq: PrqRunner, redis_url: str, key_prefix: str
) -> None:
    # Given a worker with a 0.5 s shutdown timeout, holding a request that takes 30 s
    worker = serve(prq, "blocking_double", "poll://cli-stuck", "--shutdown-timeout", "0.5")
    settings = QueueSettings(pickup_timeout_s=30, poll_interval_s=0.5)
    async with AsyncQueue.from_url(redis_url, prefix=key_prefix, settings=settings) as caller:
        request = Request(endpoint="poll://cli-stuck", method="sleep", params=30)
        call = asyncio.create_task(caller.queue_and_wait(request))
        await wait_for_state(caller, request.id, RequestState.TAKEN)

        # When it gets SIGTERM
        worker.signal(signal.SIGTERM)
        stopping = time.monotonic()

        # Then it exits 1 once the shutdown timeout passed, saying what it abandoned
        assert await asyncio.to_thread(worker.wait, 10) == 1
        assert time.monotonic() - stopping < 3.0
        worker.wait_for_line("abandoning the requests still running")
        # And it gave the request back first: the caller learns at once that it shut down
        with pytest.raises(ReceiverLost, match="shut down"):
            await asyncio.wait_for(call, 3)


async def test_a_second_signal_stops_at_once(
    prq: PrqRunner, redis_url: str, key_prefix: str
) -> None:
    # Given a worker stopping with a long shutdown timeout, holding a request that takes 30 s
    worker = serve(prq, "blocking_double", "poll://cli-twice", "--shutdown-timeout", "60")
    settings = QueueSettings(pickup_timeout_s=30, poll_interval_s=0.5)
    async with AsyncQueue.from_url(redis_url, prefix=key_prefix, settings=settings) as caller:
        request = Request(endpoint="poll://cli-twice", method="sleep", params=30)
        call = asyncio.create_task(caller.queue_and_wait(request))
        await wait_for_state(caller, request.id, RequestState.TAKEN)
        worker.signal(signal.SIGTERM)
        await asyncio.to_thread(worker.wait_for_line, "stopping")

        # When a second signal comes, Then the worker exits 1 at once
        worker.signal(signal.SIGINT)
        assert await asyncio.to_thread(worker.wait, 5) == 1
        call.cancel()


# -- stats ----------------------------------------------------------------------------------------


async def test_stats_shows_the_endpoint_a_worker_serves(
    prq: PrqRunner, redis_url: str, key_prefix: str
) -> None:
    # Given a worker that served a call, and has reported its endpoint (data-loss check turn)
    serve(prq, "double", "poll://cli-stats")
    assert prq.run("call", "poll://cli-stats", "double", "2").returncode == 0
    inspector = Inspector.from_url(redis_url, prefix=key_prefix)
    try:

        async def reported() -> bool:
            infos = {i.endpoint: i for i in await inspector.endpoints()}
            return "poll://cli-stats" in infos and infos["poll://cli-stats"].receivers > 0

        await async_wait_until(reported, 10, 0.05, "the worker reported its endpoint")
    finally:
        await inspector.aclose()

    # When `prq stats --json` runs
    shown = await asyncio.to_thread(prq.run, "stats", "--json")

    # Then it lists the endpoint with its live receiver and its enqueue count
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    (info,) = [e for e in report["endpoints"] if e["endpoint"] == "poll://cli-stats"]
    assert info["receivers"] == 1 and info["enqueued_total"] == 1 and info["depth"] == 0
    assert report["prefix"] == key_prefix and report["redis"]["ok"] is True

    # And the table form shows it too
    table = await asyncio.to_thread(prq.run, "stats")
    assert table.returncode == 0 and "poll://cli-stats" in table.stdout


def test_stats_watch_refreshes_until_sigint(prq: PrqRunner) -> None:
    # Given `prq stats --watch` printing JSON lines
    watching = prq.start("stats", "--watch", "0.2", "--json")
    assert watching.process.stdout is not None
    first = json.loads(watching.process.stdout.readline())
    second = json.loads(watching.process.stdout.readline())
    assert first["redis"]["ok"] and second["redis"]["ok"]

    # When Ctrl-C comes, Then it exits 0
    watching.signal(signal.SIGINT)
    assert watching.wait() == 0


# -- api ------------------------------------------------------------------------------------------


def test_api_without_a_token_generates_one_and_prints_the_dashboard_url_once(
    prq: PrqRunner,
) -> None:
    # Given the admin service started with no admin token configured
    port = free_port()
    service = prq.start("api", "--port", str(port))

    # When it starts, Then it prints the dashboard URL with a generated token, once
    line = service.wait_for_line("/dashboard#token=")
    token = line.strip().rsplit("#token=", 1)[1]
    assert len(token) >= 32
    base = f"http://127.0.0.1:{port}"

    # And the token is an admin token of this run
    with httpx.Client(base_url=base, timeout=5) as client:
        health = _wait_for_health(client)
        assert health.status_code == 200
        assert client.get("/api/whoami").status_code == 401
        whoami = client.get("/api/whoami", headers={"Authorization": f"Bearer {token}"})
        assert whoami.status_code == 200 and whoami.json()["role"] == "admin"

    # When it is told to stop, Then it stops (uvicorn shuts down, then re-raises the signal),
    # and the token appeared nowhere else
    service.signal(signal.SIGTERM)
    assert service.wait() in (0, -signal.SIGTERM)
    assert "".join(service.lines).count(token) == 1


def _wait_for_health(client: httpx.Client, timeout_s: float = START_TIMEOUT_S) -> httpx.Response:
    """The first answer of /health, whatever its status, once the service listens."""

    def answer() -> httpx.Response | None:
        try:
            return client.get("/health")
        except httpx.TransportError:
            return None  # uvicorn is still binding its port

    response: httpx.Response = wait_until(answer, timeout_s, 0.05, "the service listens")
    return response


def test_api_listens_at_once_while_redis_is_down_and_reports_it_until_redis_answers(
    prq: PrqRunner,
) -> None:
    # Given the admin service pointed at a port where no Redis listens, with the default retry
    # budget (30 s: what kept it from listening before)
    redis_port, port = free_port(), free_port()
    tokens_for_api = f"adm-{secrets.token_urlsafe(24)}"
    service = prq.start(
        "api",
        "--port",
        str(port),
        PRQ_REDIS_URL=f"redis://127.0.0.1:{redis_port}/0",
        PRQ_RETRY_BUDGET_S="30",
        PRQ_API_ADMIN_TOKENS=tokens_for_api,
    )
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base, timeout=10) as client:
        # When it is asked for its health, Then it answers before the retry budget could have
        # passed: 503, down (20 s: a loaded CI host took over 8 s to start the process)
        health = _wait_for_health(client, timeout_s=20.0)
        assert health.status_code == 503
        assert health.json()["status"] == "down"
        assert health.json()["redis"] == {**health.json()["redis"], "ok": False}
        assert "did not answer" in health.json()["redis"]["error"]
        # And another route answers 503 with the typed error body, without waiting for Redis
        started = time.monotonic()
        listed = client.get("/api/endpoints", headers={"Authorization": f"Bearer {tokens_for_api}"})
        assert listed.status_code == 503
        assert listed.json()["error"]["type"] in ("queue_unavailable", "redis_timeout")
        assert time.monotonic() - started < 8.0

        # When a Redis starts on that port, Then health turns 200 without a restart
        with EmbeddedRedis(port=redis_port):
            health = wait_until(
                lambda: (answer := client.get("/health")).status_code == 200 and answer,
                20.0, 0.1, "health turns 200 once Redis answers",
            )  # fmt: skip
            assert health.json()["status"] in ("ok", "degraded")
            listed = client.get(
                "/api/endpoints", headers={"Authorization": f"Bearer {tokens_for_api}"}
            )
            assert listed.status_code == 200
            service.signal(signal.SIGTERM)
            assert service.wait() in (0, -signal.SIGTERM)
