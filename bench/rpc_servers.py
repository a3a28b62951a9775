"""bench/rpc.py's server processes: each variant's echo server (raw redis-py list RPC or prq's
serve, asyncio or threads), spawned in its own OS process, started and stopped within bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import multiprocessing
import multiprocessing.synchronize
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import redis
import redis.asyncio

from prq import AsyncQueue, Queue, Request
from prq.serve.collector import relax_collector

logger = logging.getLogger(__name__)

#: The endpoint the prq server process serves.
ENDPOINT = "poll://bench-echo"
#: What tells a raw server worker to exit.
STOP = b"__stop__"
#: Bounds: server start-up, server stop.
SERVER_START_TIMEOUT_S = 30.0
SERVER_STOP_TIMEOUT_S = 10.0


# -- servers (each runs in its own spawned process) ----------------------------------------------


def _echo_raw(message: bytes | str) -> tuple[bytes, bytes]:
    """Split `reply key|request JSON`; return the reply key and the reply JSON."""
    if isinstance(message, str):
        message = message.encode()
    reply_key, _, body = message.partition(b"|")
    request = json.loads(body)
    reply = json.dumps({"id": request["id"], "result": request["params"]}).encode()
    return reply_key, reply


async def _raw_server_async(url: str, request_key: str, ready_key: str, workers: int) -> None:
    client = redis.asyncio.Redis.from_url(url, max_connections=workers + 2)

    async def work() -> None:
        while True:
            item = await client.blpop([request_key], timeout=30)
            if item is None:
                continue
            if item[1] == STOP:
                return
            reply_key, reply = _echo_raw(item[1])
            await client.lpush(reply_key, reply)

    tasks = [asyncio.create_task(work()) for _ in range(workers)]
    await client.lpush(ready_key, b"ready")
    await asyncio.gather(*tasks)
    await client.aclose()


def _raw_server_sync(url: str, request_key: str, ready_key: str, workers: int) -> None:
    pool = redis.ConnectionPool.from_url(url, max_connections=workers + 2)
    client = redis.Redis(connection_pool=pool)

    def work() -> None:
        while True:
            item = client.blpop([request_key], timeout=30)
            if item is None:
                continue
            if item[1] == STOP:
                return
            reply_key, reply = _echo_raw(item[1])
            client.lpush(reply_key, reply)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(workers)]
    for thread in threads:
        thread.start()
    client.lpush(ready_key, b"ready")
    for thread in threads:
        thread.join()
    pool.disconnect()


async def _prq_server_async(
    url: str, prefix: str, ready_key: str, workers: int, stop: multiprocessing.synchronize.Event
) -> None:
    async def echo(request: Request) -> Any:
        return request.params

    async with AsyncQueue.from_url(url, prefix=prefix) as queue:
        stop_serving = asyncio.Event()
        server = asyncio.create_task(
            queue.serve(ENDPOINT, echo, concurrency=workers, stop=stop_serving)
        )
        ready = redis.asyncio.Redis.from_url(url)
        await ready.lpush(ready_key, b"ready")
        await ready.aclose()
        while not stop.is_set() and not server.done():
            await asyncio.sleep(0.1)
        stop_serving.set()
        await asyncio.wait([server], timeout=SERVER_STOP_TIMEOUT_S / 2)


def _prq_server_sync(
    url: str, prefix: str, ready_key: str, workers: int, stop: multiprocessing.synchronize.Event
) -> None:
    def echo(request: Request) -> Any:
        return request.params

    with Queue.from_url(url, prefix=prefix) as queue:
        stop_serving = threading.Event()
        server = threading.Thread(
            target=queue.serve,
            args=(ENDPOINT, echo),
            kwargs={"concurrency": workers, "stop": stop_serving},
            daemon=True,
        )
        server.start()
        redis.Redis.from_url(url).lpush(ready_key, b"ready")
        while not stop.wait(0.1) and server.is_alive():
            pass
        stop_serving.set()
        server.join(SERVER_STOP_TIMEOUT_S / 2)


def server_main(
    variant: str,
    url: str,
    prefix: str,
    ready_key: str,
    workers: int,
    stop: multiprocessing.synchronize.Event,
) -> None:
    """Entry point of a server process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    relax_collector()  # as `prq worker` does; the same for every variant
    request_key = f"{prefix}:raw:req"
    if variant == "raw-async":
        asyncio.run(_raw_server_async(url, request_key, ready_key, workers))
    elif variant == "raw-sync":
        _raw_server_sync(url, request_key, ready_key, workers)
    elif variant == "prq-async":
        asyncio.run(_prq_server_async(url, prefix, ready_key, workers, stop))
    elif variant == "prq-sync":
        _prq_server_sync(url, prefix, ready_key, workers, stop)
    else:
        raise ValueError(f"unknown variant {variant!r}")


@contextlib.contextmanager
def server_process(
    variant: str, url: str, prefix: str, workers: int, control: redis.Redis
) -> Iterator[int]:
    """Run the variant's server process for the duration of the block (bounded start and stop)."""
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    ready_key = f"{prefix}:ready:{variant}"
    process = ctx.Process(
        target=server_main,
        args=(variant, url, prefix, ready_key, workers, stop),
        name=f"bench-server-{variant}",
        daemon=True,
    )
    process.start()
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while control.blpop([ready_key], timeout=1) is None:
            if process.exitcode is not None:
                raise RuntimeError(f"{variant} server exited with {process.exitcode} at start")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{variant} server not ready in {SERVER_START_TIMEOUT_S} s")
        assert process.pid is not None
        yield process.pid
    finally:
        stop.set()
        if variant.startswith("raw-"):
            control.rpush(f"{prefix}:raw:req", *([STOP] * workers))
        process.join(SERVER_STOP_TIMEOUT_S)
        if process.is_alive():
            logger.warning("%s server did not stop in time; terminating", variant)
            process.terminate()
            process.join(2.0)
        if process.is_alive():
            process.kill()
            process.join(2.0)
