"""Signed envelopes: requests and responses that carry an HMAC a node checks before it trusts
them.

With a signing key configured (`QueueSettings.signing_key`, never written to Redis), every body
prq stores is wrapped in an envelope:

    #prq-sig1 <key id> <expiry, ms since the epoch> <HMAC-SHA256, hex>\\n<the JSON body>

The MAC covers the kind ("request" or "response"), the request id, the endpoint, the expiry and
the body, each length-prefixed, so a body moved to another id or endpoint, edited, or kept past
its expiry does not verify. Receivers check requests before decoding them (a failure is
dead-lettered and never reaches the service); callers check responses (a failure raises
SignatureError instead of returning what an attacker wrote).

Rotation: the previous key (`signing_key_previous`) still verifies until
`signing_key_previous_until`; new envelopes are always signed with the current key. The key id
(a hash of the key, not the key) tells which key signed an envelope.

Expiry bounds replays: an envelope copied back into Redis verifies only until its expiry (plus
`signing_clock_skew_s` for the nodes' clocks). A request's expiry is the latest time a
legitimate delivery could still be taken (its pickup window, times its attempts for
at_least_once); a response's is its response TTL.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from prq.errors import SignatureError

if TYPE_CHECKING:
    from prq.config import QueueSettings

__all__ = ["ENVELOPE_MAGIC", "Signer", "is_signed", "unwrap"]

#: How every envelope starts (a JSON body never does).
ENVELOPE_MAGIC = b"#prq-sig1 "
#: Longest header accepted (magic, key id, expiry, MAC and separators fit well inside).
_MAX_HEADER = 200
Kind = Literal["request", "response"]


def is_signed(data: bytes) -> bool:
    """Whether `data` is an envelope (it may still be forged: see Signer.open)."""
    return data.startswith(ENVELOPE_MAGIC)


def unwrap(data: bytes) -> bytes:
    """The body inside an envelope, unchecked (for display, and for nodes without a key);
    `data` itself when it is not an envelope."""
    if not is_signed(data):
        return data
    end = data.find(b"\n", 0, _MAX_HEADER)
    return data[end + 1 :] if end >= 0 else data


def key_id(key: bytes) -> str:
    """A short public name of a key (a hash, from which the key cannot be found)."""
    return hashlib.sha256(b"prq-signing-key-id\x00" + key).hexdigest()[:12]


def _field(value: bytes) -> bytes:
    return str(len(value)).encode() + b":" + value


def _mac(
    key: bytes, kind: Kind, request_id: str, endpoint: str, expiry_ms: int, body: bytes
) -> str:
    message = b"".join(
        (
            _field(b"prq-sig1"),
            _field(kind.encode()),
            _field(request_id.encode()),
            _field(endpoint.encode("utf-8", "surrogatepass")),
            _field(str(expiry_ms).encode()),
            body,
        )
    )
    return hmac.new(key, message, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class _Key:
    secret: bytes
    kid: str
    #: Last moment (ms since the epoch) the key verifies; None: no end.
    until_ms: int | None = None


class Signer:
    """Signs with the current key; verifies with it, or with the previous key during its grace
    window."""

    def __init__(
        self,
        key: bytes,
        *,
        previous: bytes | None = None,
        previous_until_ms: int | None = None,
        clock_skew_ms: int = 60_000,
    ) -> None:
        self._current = _Key(key, key_id(key))
        self._keys = {self._current.kid: self._current}
        if previous is not None:
            old = _Key(previous, key_id(previous), previous_until_ms)
            self._keys.setdefault(old.kid, old)
        self.clock_skew_ms = clock_skew_ms

    @classmethod
    def from_settings(cls, settings: QueueSettings) -> Signer | None:
        """The signer the settings ask for, or None when no signing key is set."""
        if settings.signing_key is None:
            return None
        previous = settings.signing_key_previous
        until = settings.signing_key_previous_until
        return cls(
            settings.signing_key.get_secret_value().encode(),
            previous=None if previous is None else previous.get_secret_value().encode(),
            previous_until_ms=None if until is None else int(until.timestamp() * 1000),
            clock_skew_ms=int(settings.signing_clock_skew_s * 1000),
        )

    @property
    def key_id(self) -> str:
        return self._current.kid

    def sign(
        self, kind: Kind, request_id: str, endpoint: str, body: bytes, expiry_ms: int
    ) -> bytes:
        """`body` in an envelope valid until `expiry_ms`."""
        mac = _mac(self._current.secret, kind, request_id, endpoint, expiry_ms, body)
        header = f"{self._current.kid} {expiry_ms} {mac}\n".encode()
        return ENVELOPE_MAGIC + header + body

    def open(
        self,
        kind: Kind,
        request_id: str,
        endpoint: str,
        data: bytes,
        now_ms: int | None = None,
    ) -> bytes:
        """The body of a valid envelope for this request; SignatureError otherwise."""
        where = f"{kind} {request_id} for {endpoint!r}"
        if not is_signed(data):
            raise SignatureError(f"{where} is not signed, and this node requires signatures",
                                 reason="unsigned")  # fmt: skip
        end = data.find(b"\n", 0, _MAX_HEADER)
        parts = data[len(ENVELOPE_MAGIC) : end].split(b" ") if end >= 0 else []
        if len(parts) != 3 or not parts[1].isdigit():
            raise SignatureError(f"{where} has a malformed signature header", reason="malformed")
        kid, expiry_ms, mac = parts[0].decode("ascii", "replace"), int(parts[1]), parts[2]
        body = data[end + 1 :]
        now = int(time.time() * 1000) if now_ms is None else now_ms
        key = self._keys.get(kid)
        if key is None or (key.until_ms is not None and now > key.until_ms):
            raise SignatureError(
                f"{where} is signed with key {kid!r}, which this node does not accept (an "
                "unknown key, or a previous key past its grace window)",
                reason="unknown_key",
            )
        expected = _mac(key.secret, kind, request_id, endpoint, expiry_ms, body)
        if not hmac.compare_digest(expected.encode(), mac):
            raise SignatureError(
                f"{where} does not match its signature: it was forged, tampered with, or "
                "moved from another request",
                reason="mismatch",
            )
        if now > expiry_ms + self.clock_skew_ms:
            raise SignatureError(
                f"{where}'s signature expired {(now - expiry_ms) / 1000:.0f} s ago (a replay, "
                "or a request that waited past its pickup window)",
                reason="expired",
            )
        return body
