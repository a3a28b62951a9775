"""TLS failures: which ones a retry cannot mend, and what to tell the operator about them.

A wrong CA, certificate or host name fails a connection at once with `ConfigurationError`
(`tls_configuration_error`) instead of being retried for the whole retry budget; a TLS
connection that merely ended (a restart can cause that) is retried, after `tls_probe` asked the
server whether it was a refusal in disguise.
"""

from __future__ import annotations

import socket
import ssl
from urllib.parse import urlsplit

from prq.core.config import RedisSettings
from prq.core.errors import ConfigurationError
from prq.transport.topology import locate

__all__ = ["tls_configuration_error", "tls_eof", "tls_failure", "tls_probe"]


#: TLS failures that a retry cannot mend: the certificate chain or name does not verify, or the
#: server refused the handshake (no or a wrong client certificate, plaintext server, versions).
#: An EOF or reset in the middle of a handshake is not among them: a restart can cause those.
_TLS_TRANSIENT = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLWantReadError)


def tls_failure(exc: BaseException) -> ssl.SSLError | None:
    """The TLS error behind a connection failure, if it is one a retry cannot mend."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ssl.SSLError) and not isinstance(cause, _TLS_TRANSIENT):
            return cause
        cause = cause.__cause__ or cause.__context__
    return None


def tls_eof(exc: BaseException) -> bool:
    """Whether a connection failure is a TLS connection that ended without saying why."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ssl.SSLEOFError | ssl.SSLZeroReturnError):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def tls_probe(settings: RedisSettings) -> ssl.SSLError | None:
    """Ask the server why a TLS connection ended: connect once more and read before writing.

    Under TLS 1.3 a server refuses a missing or unknown client certificate only after the
    handshake, with an alert. A client that writes first can race the server's close and see a
    bare EOF, which a restart also causes, so it would retry for its whole budget. Reading first
    gets the alert. Returns the refusal a retry cannot mend; None if the server is fine with
    this client or did not say (it was restarting, or is slow): the caller retries then.
    """
    if locate(settings.url).sentinel:
        return None  # the primary's address is the sentinels' to tell: no probe, retry
    parts = urlsplit(settings.url)
    host = parts.hostname or "localhost"
    context = ssl.create_default_context(cafile=settings.ssl_ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = settings.ssl_check_hostname
    if settings.ssl_cert_file is not None:
        context.load_cert_chain(settings.ssl_cert_file, settings.ssl_key_file)
    try:
        with (
            socket.create_connection(
                (host, parts.port or 6379), timeout=settings.connect_timeout_s
            ) as raw,
            context.wrap_socket(raw, server_hostname=host) as tls,
        ):
            tls.settimeout(TLS_PROBE_WAIT_S)
            tls.recv(1)  # a healthy server says nothing until asked: this times out
    except ssl.SSLError as exc:
        return tls_failure(exc)
    except OSError:
        return None
    return None


#: How long a TLS probe waits for the server's alert after the handshake.
TLS_PROBE_WAIT_S = 1.0


def tls_configuration_error(error: ssl.SSLError) -> ConfigurationError:
    if isinstance(error, ssl.SSLCertVerificationError):
        what = (
            f"the server's certificate did not verify ({error.verify_message}): check "
            "ssl_ca_file (the CA that signed it) and that the URL's host is a name the "
            "certificate holds"
        )
    else:
        what = (
            f"the TLS handshake failed ({error.reason or error}): check the client "
            "certificate (ssl_cert_file, ssl_key_file) if the server requires one, and that "
            "the server speaks TLS on that port"
        )
    return ConfigurationError(f"cannot connect to Redis over TLS: {what}")
