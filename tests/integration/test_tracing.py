"""Tracing across processes (prq.observe.tracing): W3C trace context in the headers, OpenTelemetry
spans.

A receiver process and a caller process, each with the SDK's in-memory exporter
(tracing_child.py), print their finished spans; one trace must show the caller's enqueue, the
wait in queue, the handling and the answer, with the parent/child links right, for `call`,
`send`, `notify` and BulkClient; a malformed traceparent of the caller's own still runs and
starts a fresh trace. A process that does not use OpenTelemetry never imports it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.integration.tracing_child import MALFORMED

pytestmark = pytest.mark.integration

CHILD = Path(__file__).with_name("tracing_child.py")
ROOT = Path(__file__).resolve().parents[2]
#: Bound on each process's run, seconds.
RUN_S = 60.0
#: The requests the caller makes (tracing_child.call), by id.
IDS = ("call-work", "call-fail", "sent", "notified", "malformed", "bulk")
#: The ids sent through a call (a CLIENT span around the PRODUCER span).
CALLS = ("call-work", "call-fail", "sent", "malformed")


def _command(role: str, redis_url: str, prefix: str, endpoint: str, facade: str) -> list[str]:
    return [sys.executable, str(CHILD), role, redis_url, prefix, endpoint, facade, str(len(IDS))]


def _last_json(stdout: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return result


def run_both(redis_url: str, prefix: str, endpoint: str, facade: str) -> tuple[Any, Any]:
    """The receiver's output and the caller's (each: its spans, and what the caller got)."""
    receiver = subprocess.Popen(
        _command("serve", redis_url, prefix, endpoint, facade),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert receiver.stdout is not None
        with ThreadPoolExecutor(1) as reader:
            ready = reader.submit(receiver.stdout.readline).result(timeout=RUN_S)
        assert ready.strip() == "ready", receiver.stderr.read() if receiver.stderr else ""
        caller = subprocess.run(
            _command("call", redis_url, prefix, endpoint, facade),
            cwd=ROOT, capture_output=True, text=True, timeout=RUN_S, check=False,
        )  # fmt: skip
        assert caller.returncode == 0, caller.stderr
        stdout, stderr = receiver.communicate(timeout=RUN_S)
        assert receiver.returncode == 0, stderr
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.communicate(timeout=RUN_S)
    return _last_json(stdout), _last_json(caller.stdout)


def one(spans: list[dict[str, Any]], name: str, request_id: str | None = None) -> dict[str, Any]:
    """The one span named `name` (of request `request_id`)."""
    found = [
        span
        for span in spans
        if span["name"] == name
        and (request_id is None or span["attributes"].get("messaging.message.id") == request_id)
    ]
    assert len(found) == 1, (name, request_id, [s["name"] for s in spans])
    return found[0]


def children(spans: list[dict[str, Any]], parent: dict[str, Any]) -> list[dict[str, Any]]:
    return [span for span in spans if span["parent"] == parent["span_id"]]


def test_one_trace_across_a_caller_and_a_receiver_process(
    facade: str, redis_url: str, key_prefix: str
) -> None:
    endpoint = "poll://traced"
    receiver, caller = run_both(redis_url, key_prefix, endpoint, facade)
    got, sent_spans, served = caller["out"], caller["spans"], receiver["spans"]
    client = one(sent_spans, "client")
    trace_id = client["trace_id"]
    assert got["fail"] == "ValueError" and got["bulk"] == 1

    for request_id in IDS:
        if request_id == "malformed":
            continue
        send = one(sent_spans, "send" if request_id == "bulk" else f"send {endpoint}",
                   None if request_id == "bulk" else request_id)  # fmt: skip
        assert send["kind"] == "PRODUCER" and send["trace_id"] == trace_id
        assert send["attributes"]["messaging.system"] == "prq"
        assert send["attributes"]["messaging.operation.type"] == "send"
        if request_id in CALLS:
            call = one(sent_spans, f"call {endpoint}", request_id)
            assert call["kind"] == "CLIENT" and call["parent"] == client["span_id"]
            assert send["parent"] == call["span_id"]
            assert call["end"] >= send["end"]  # the wait for the answer is in the call span
        else:
            assert send["parent"] == client["span_id"]

        # the receiver: the wait in queue, then the handling, both children of the send span
        queued = one(served, f"queued {endpoint}", request_id)
        process = one(served, f"process {endpoint}", request_id)
        for span in (queued, process):
            assert span["trace_id"] == trace_id, (request_id, span)
            assert span["parent"] == send["span_id"], (request_id, span)
            assert span["kind"] == "CONSUMER"
            assert span["attributes"]["messaging.system"] == "prq"
            assert span["attributes"]["messaging.destination.name"] == endpoint
            assert span["attributes"]["messaging.message.id"] == request_id
        assert queued["attributes"]["messaging.operation.type"] == "receive"
        assert process["attributes"]["messaging.operation.type"] == "process"
        # queued from its creation (after the send began: ms resolution) to its pickup
        assert send["start"] - 1_000_000 <= queued["start"] <= queued["end"] <= process["start"]
        (work,) = children(served, process)  # the handler runs inside the process span
        assert work["name"] == "handler work"

    failed = one(served, f"process {endpoint}", "call-fail")
    assert failed["status"] == "ERROR" and "exception" in failed["events"]
    assert one(sent_spans, f"call {endpoint}", "call-fail")["status"] == "ERROR"
    assert one(served, f"process {endpoint}", "call-work")["status"] == "UNSET"
    work_send = one(sent_spans, f"send {endpoint}", "call-work")
    assert work_send["span_id"] in got["work"]["headers"]["traceparent"]
    check_malformed(receiver, caller, endpoint)


def check_malformed(receiver: Any, caller: Any, endpoint: str) -> None:
    """A request whose caller set a malformed traceparent of its own ran, in a fresh trace."""
    # the caller's own header went as it was (not overwritten), and the request ran
    assert caller["out"]["malformed"]["headers"]["traceparent"] == MALFORMED
    client = one(caller["spans"], "client")
    # the caller's own spans stay in its current trace
    assert one(caller["spans"], f"call {endpoint}", "malformed")["parent"] == client["span_id"]
    process = one(receiver["spans"], f"process {endpoint}", "malformed")
    queued = one(receiver["spans"], f"queued {endpoint}", "malformed")
    for span in (process, queued):
        assert span["parent"] is None
        assert span["trace_id"] != client["trace_id"]
    assert process["status"] == "UNSET"
    (work,) = children(receiver["spans"], process)
    assert work["trace_id"] == process["trace_id"]


#: Runs a node serving and calling in one process with every `opentelemetry` import refused
#: (as if it were not installed), and reports which module tried each (redis-py 8 tries on its
#: own, for its optional metrics).
NOT_INSTALLED = """
import asyncio, json, sys, threading

tried = []

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.startswith("<frozen"):
                frame = frame.f_back
            tried.append([name, frame.f_globals.get("__name__") if frame else None])
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())

from prq import AsyncQueue, Queue, Request
from prq.bulk import BulkClient

url, prefix, facade = sys.argv[1:4]
endpoint = "poll://untraced"
parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
traced = Request(endpoint=endpoint, method="m", headers={"traceparent": parent})

def handle(request):
    return request.headers

def run_sync():
    stop = threading.Event()
    with Queue.from_url(url, prefix=prefix) as queue:
        serve = lambda: queue.serve(endpoint, handle, stop=stop)
        server = threading.Thread(target=serve)
        server.start()
        try:
            queue.notify(endpoint, "m")
            return [queue.call(endpoint, "m"), queue.queue_and_wait(traced).result]
        finally:
            stop.set()
            server.join(30)

async def run_async():
    stop = asyncio.Event()
    async with AsyncQueue.from_url(url, prefix=prefix) as queue:
        server = asyncio.create_task(queue.serve(endpoint, handle, stop=stop))
        try:
            await queue.notify(endpoint, "m")
            return [await queue.call(endpoint, "m"), (await queue.queue_and_wait(traced)).result]
        finally:
            stop.set()
            await asyncio.wait_for(server, 30)

results = run_sync() if facade == "sync" else asyncio.run(run_async())
with BulkClient.from_url(url, prefix=prefix) as bulk:
    results.append(bulk.enqueue_many([Request(endpoint=endpoint, method="m")]).accepted)
loaded = sorted(name for name in sys.modules if name.startswith("opentelemetry"))
print(json.dumps({"results": results, "tried": tried, "loaded": loaded}))
"""


def test_prq_never_imports_opentelemetry_when_it_is_not_installed(
    facade: str, redis_url: str, key_prefix: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", NOT_INSTALLED, redis_url, key_prefix, facade],
        cwd=ROOT, capture_output=True, text=True, timeout=RUN_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = _last_json(done.stdout)
    assert report["loaded"] == []
    by_prq = [[name, by] for name, by in report["tried"] if by is None or by.startswith("prq")]
    assert by_prq == []
    call, traced, bulk = report["results"]
    assert call == {} and bulk == 1
    # a request that carries a trace context runs as any other, its headers untouched
    assert traced == {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
