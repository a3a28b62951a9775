"""The receiver of the call-and-collect tests, run by a `prq worker` subprocess.

Every execution appends the request id to the ledger file named by PRQ_TEST_LEDGER (one line
per run), so a test can tell how often each request ran. Rows whose `n` is a multiple of 7
fail with a ValueError.
"""

from __future__ import annotations

import os
import threading

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
