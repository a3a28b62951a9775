"""The receiver of the call-and-collect tests, run by a `prq worker` subprocess.

Every execution appends the request id to the ledger file named by PRQ_TEST_LEDGER (one line
per run), so a test can tell how often each request ran. Rows whose `n` is a multiple of 7
fail with a ValueError.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

from prq import Request

_lock = threading.Lock()
_ledger = open(os.environ["PRQ_TEST_LEDGER"], "a", buffering=1)  # noqa: SIM115 (process-long)


async def record(request: Request) -> object:
    with _lock:
        _ledger.write(request.id + "\n")
    params = request.params if isinstance(request.params, dict) else {}
    n = params.get("n")
    if isinstance(n, int) and n % 7 == 0:
        raise ValueError(f"{n} is a multiple of 7")
    return {"n": n, "squared": n * n if isinstance(n, int) else None}


async def record_or_die(request: Request) -> object:
    """`record`, except that the process running the row whose `n` is PRQ_TEST_DIE_AT kills
    itself (SIGKILL) right after recording it, holding whatever else it runs, unless the file
    PRQ_TEST_DIE_MARKER exists: the first to get that row creates the file, so one worker dies."""
    params = request.params if isinstance(request.params, dict) else {}
    if params.get("n") == int(os.environ["PRQ_TEST_DIE_AT"]):
        try:
            marker = os.open(os.environ["PRQ_TEST_DIE_MARKER"], os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            return await record(request)
        os.close(marker)
        with _lock:
            _ledger.write(request.id + "\n")
        os.kill(os.getpid(), signal.SIGKILL)
    return await record(request)


async def echo_large(request: Request) -> object:
    """`record`, answering with the row's `text` twice (a body over the inline limit)."""
    answer = await record(request)
    params = request.params if isinstance(request.params, dict) else {}
    return {"answer": answer, "text": str(params.get("text", "")) * 2}


#: Longest a gated row waits for its gate (bounds a test that never opens it).
GATE_TIMEOUT_S = 60.0


async def record_gated(request: Request) -> object:
    """`record`, except that a row whose `n` is at least PRQ_TEST_GATE_FROM, once recorded
    (it started running), waits until the file PRQ_TEST_GATE exists before it answers."""
    params = request.params if isinstance(request.params, dict) else {}
    n = params.get("n")
    if not isinstance(n, int) or n < int(os.environ["PRQ_TEST_GATE_FROM"]):
        return await record(request)
    with _lock:
        _ledger.write(request.id + "\n")
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not os.path.exists(os.environ["PRQ_TEST_GATE"]) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)  # polling the gate file, bounded above
    return {"n": n, "squared": n * n}
