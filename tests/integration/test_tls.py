"""TLS to Redis against a TLS-only `redis-server` with a test CA (trustme).

The server listens on a TLS port only (`--port 0`). Its certificate names `localhost`, so a
`rediss://localhost` URL verifies and `rediss://127.0.0.1` does not (the name differs). A second
server requires client certificates (`--tls-auth-clients yes`).
"""

from __future__ import annotations

import contextlib
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import trustme

from prq import ConfigurationError, QueueUnavailable, RedisSettings, Response
from prq.embedded import find_server_binary, free_port
from prq.transport.tls import tls_failure, tls_probe
from tests.queue_facades import QueueFactory, run_all
from tests.redis_servers import wait_until

pytestmark = pytest.mark.integration

#: A retry budget far longer than the test may take: a TLS misconfiguration must not use it up.
LONG_BUDGET_S = 60.0
#: How soon a misconfiguration must be reported (a few connection attempts, no budget).
FAST_S = 5.0


@dataclass(frozen=True)
class Pki:
    """Files of a test CA, the server's certificate and a client certificate (all PEM)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("localhost")
    client = ca.issue_cert("prq-client@example.test")
    files = Pki(
        ca=folder / "ca.pem",
        server_cert=folder / "server.pem",
        server_key=folder / "server.key",
        client_cert=folder / "client.pem",
        client_key=folder / "client.key",
        other_ca=folder / "other-ca.pem",
    )
    ca.cert_pem.write_to_path(str(files.ca))
    other.cert_pem.write_to_path(str(files.other_ca))
    server.private_key_pem.write_to_path(str(files.server_key))
    client.private_key_pem.write_to_path(str(files.client_key))
    files.server_cert.write_bytes(b"".join(blob.bytes() for blob in server.cert_chain_pems))
    files.client_cert.write_bytes(b"".join(blob.bytes() for blob in client.cert_chain_pems))
    return files


@contextlib.contextmanager
def tls_only_server(pki: Pki, tmp_path: Path, *, client_certs: bool) -> Iterator[int]:
    """A redis-server with a TLS port and no plaintext port; yields the TLS port."""
    port = free_port()
    command = [
        find_server_binary(),
        "--port", "0",
        "--tls-port", str(port),
        "--bind", "127.0.0.1",
        "--tls-cert-file", str(pki.server_cert),
        "--tls-key-file", str(pki.server_key),
        "--tls-ca-cert-file", str(pki.ca),
        "--tls-auth-clients", "yes" if client_certs else "no",
        "--save", "",
        "--appendonly", "no",
        "--dir", str(tmp_path),
        "--logfile", str(tmp_path / "redis-tls.log"),
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    probe = redis.Redis(
        host="localhost",
        port=port,
        ssl=True,
        ssl_ca_certs=str(pki.ca),
        ssl_certfile=str(pki.client_cert),
        ssl_keyfile=str(pki.client_key),
        socket_timeout=1,
        socket_connect_timeout=1,
    )

    def answers() -> bool:
        assert process.poll() is None, f"redis-server exited; see {tmp_path / 'redis-tls.log'}"
        with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
            return bool(probe.ping())
        return False

    try:
        wait_until(answers, 10, 0.02, "the TLS redis-server answers")
        yield port
    finally:
        probe.close()
        process.kill()
        process.wait(10)


# (a test names its server before `make_queue`: the server is then set up first and stopped
# last, after the test's nodes closed, not under them)
@pytest.fixture
def tls_port(pki: Pki, tmp_path: Path) -> Iterator[int]:
    with tls_only_server(pki, tmp_path, client_certs=False) as port:
        yield port


@pytest.fixture
def mtls_port(pki: Pki, tmp_path: Path) -> Iterator[int]:
    with tls_only_server(pki, tmp_path, client_certs=True) as port:
        yield port


def tls_settings(url: str, **options: object) -> RedisSettings:
    return RedisSettings(url=url, socket_timeout_s=2, connect_timeout_s=2, **options)  # type: ignore[arg-type]


async def echo_round_trip(make_queue: QueueFactory, settings: RedisSettings) -> None:
    """A receiver and a caller over `settings`: one call answered end to end."""
    receiver = make_queue(redis_settings=settings)
    caller = make_queue(redis_settings=settings)
    endpoint = "poll://tls"

    async def serve_one() -> None:
        pending = await receiver.dequeue(endpoint, timeout_s=10)
        assert pending is not None
        await receiver.apply_response(Response(id=pending.id, result=pending.request.params))

    answer, _ = await run_all(
        [caller.call(endpoint, "echo", {"over": "tls"}, timeout_s=10), serve_one()], 20
    )
    assert answer == {"over": "tls"}


async def test_a_call_goes_through_a_tls_only_server(
    pki: Pki, tls_port: int, make_queue: QueueFactory
) -> None:
    # Given nodes that trust the test CA, on rediss://localhost
    settings = tls_settings(f"rediss://localhost:{tls_port}/0", ssl_ca_file=str(pki.ca))
    # Then a call is enqueued, taken, answered and returned over TLS
    await echo_round_trip(make_queue, settings)


async def test_plaintext_is_refused(tls_port: int, make_queue: QueueFactory) -> None:
    # Given a node that speaks plaintext to the TLS port
    node = make_queue(url=f"redis://localhost:{tls_port}/0", retry_budget_s=1.0)
    # Then it never gets an answer: the server only speaks TLS
    with pytest.raises(QueueUnavailable):
        await node.start()
    plain = redis.Redis(host="localhost", port=tls_port, socket_timeout=2)
    with pytest.raises(redis.ConnectionError):
        plain.ping()
    plain.close()


@pytest.mark.parametrize("case", ["wrong_ca", "wrong_name"])
async def test_a_certificate_that_does_not_verify_fails_fast_and_clearly(
    pki: Pki, tls_port: int, make_queue: QueueFactory, case: str
) -> None:
    # Given a node that trusts another CA, or that reaches the server by a name its
    # certificate does not hold (127.0.0.1 instead of localhost), with a long retry budget
    if case == "wrong_ca":
        settings = tls_settings(f"rediss://localhost:{tls_port}/0", ssl_ca_file=str(pki.other_ca))
    else:
        settings = tls_settings(f"rediss://127.0.0.1:{tls_port}/0", ssl_ca_file=str(pki.ca))
    node = make_queue(redis_settings=settings, retry_budget_s=LONG_BUDGET_S)

    # When it starts
    started = time.monotonic()
    with pytest.raises(ConfigurationError, match="did not verify") as raised:
        await node.start()

    # Then it fails at once with a configuration error that names the cause, no retries
    assert time.monotonic() - started < FAST_S
    assert "ssl_ca_file" in str(raised.value)
    assert isinstance(raised.value.__cause__, redis.ConnectionError | ssl.SSLError)


async def test_the_host_name_check_can_be_turned_off(
    pki: Pki, tls_port: int, make_queue: QueueFactory
) -> None:
    # Given a node on rediss://127.0.0.1 that trusts the CA but skips the name check
    settings = tls_settings(
        f"rediss://127.0.0.1:{tls_port}/0", ssl_ca_file=str(pki.ca), ssl_check_hostname=False
    )
    # Then it works (the chain is still verified)
    await echo_round_trip(make_queue, settings)


async def test_mutual_tls_needs_the_client_certificate(
    pki: Pki, mtls_port: int, make_queue: QueueFactory
) -> None:
    url = f"rediss://localhost:{mtls_port}/0"
    # Given a server that requires client certificates: without one, a node fails fast
    bare = make_queue(redis_settings=tls_settings(url, ssl_ca_file=str(pki.ca)), retry_budget_s=60)
    started = time.monotonic()
    with pytest.raises(ConfigurationError, match="client certificate"):
        await bare.start()
    assert time.monotonic() - started < FAST_S
    # And with the certificate the CA issued, calls go through
    settings = tls_settings(
        url,
        ssl_ca_file=str(pki.ca),
        ssl_cert_file=str(pki.client_cert),
        ssl_key_file=str(pki.client_key),
    )
    await echo_round_trip(make_queue, settings)


def test_a_probe_reads_why_the_server_refuses_a_client(pki: Pki, mtls_port: int) -> None:
    # Given a server that requires client certificates (under TLS 1.3 it refuses one only
    # after the handshake, so a client that writes first may see a bare EOF instead)
    url = f"rediss://localhost:{mtls_port}/0"
    # Then a probe that reads first gets the refusal, which a retry cannot mend
    refused = tls_probe(tls_settings(url, ssl_ca_file=str(pki.ca)))
    assert refused is not None
    assert tls_failure(refused) is refused
    # And with the client certificate the server waits for a command: nothing to report
    accepted = tls_settings(
        url,
        ssl_ca_file=str(pki.ca),
        ssl_cert_file=str(pki.client_cert),
        ssl_key_file=str(pki.client_key),
    )
    assert tls_probe(accepted) is None


def test_tls_options_need_a_tls_url_and_existing_files(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="use rediss://"):
        RedisSettings(url="redis://localhost:6379/0", ssl_ca_file=str(pki.ca))
    with pytest.raises(ValueError, match="no such file"):
        RedisSettings(url="rediss://localhost:6379/0", ssl_ca_file=str(tmp_path / "missing.pem"))
    with pytest.raises(ValueError, match="without ssl_cert_file"):
        RedisSettings(url="rediss://localhost:6379/0", ssl_key_file=str(pki.client_key))
    assert RedisSettings(url="REDISS://localhost:6379/0").tls
    assert not RedisSettings(url="redis://localhost:6379/0").tls
