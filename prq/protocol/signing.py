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

Renewal: an at_least_once request is handed out again after its receiver went silent, or gave
it back, however long that receiver ran it first; and an operator may replay a dead letter
days later. Neither may be refused as expired, yet the expiry cannot simply be made long: it is
the only bound on replays. The record's id does not bound them (whoever can write Redis can
delete a record and write it anew, or set a live one back to queued), and a receiver's memory
of what it ran covers only that receiver. So the expiry counts from the last time a node that
had the request legitimately in hand vouched for it: the sender when it enqueued it, the
receiver that holds it (every `signature_renewal_s` while it holds it, from a moment after it
took it), and a node that replays it as a dead letter at an operator's request. To vouch, a
node signs a new header for the same body (`renewal`, only for an authentic envelope: forged or
tampered ones are never renewed) and writes it under the request's renewal key, with a TTL
(the record's fields are the scripts' to write); a receiver that finds a request's envelope
expired checks it under that header instead (`renewed`). A captured envelope therefore
replays only within `2 * signature_renewal_s` of the last moment a node held it, instead of
within its enqueue window: the same kind of bound, counted from the request's last legitimate
use rather than its first.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from prq.core.errors import SignatureError

if TYPE_CHECKING:
    from prq.core.config import QueueSettings

__all__ = ["ENVELOPE_MAGIC", "Renewals", "Signer", "is_signed", "unwrap"]

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


def _expiry_ms(data: bytes) -> int | None:
    """The expiry an envelope's header names; None when there is none to read."""
    end = data.find(b"\n", 0, _MAX_HEADER)
    parts = data[len(ENVELOPE_MAGIC) : end].split(b" ") if is_signed(data) and end >= 0 else []
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


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
        return self._header(kind, request_id, endpoint, body, expiry_ms) + body

    def _header(
        self, kind: Kind, request_id: str, endpoint: str, body: bytes, expiry_ms: int
    ) -> bytes:
        mac = _mac(self._current.secret, kind, request_id, endpoint, expiry_ms, body)
        return ENVELOPE_MAGIC + f"{self._current.kid} {expiry_ms} {mac}\n".encode()

    def renewal(
        self, kind: Kind, request_id: str, endpoint: str, data: bytes, expiry_ms: int
    ) -> bytes:
        """A header that makes the envelope `data` valid until `expiry_ms`, signed with the
        current key; SignatureError when `data` is not an authentic envelope of this request.
        It is judged as of its own expiry: whether it expired since does not matter, but its
        key must have been accepted then."""
        body = self.open(kind, request_id, endpoint, data, now_ms=_expiry_ms(data))
        return self._header(kind, request_id, endpoint, body, expiry_ms)

    @staticmethod
    def renewed(data: bytes, renewal: bytes) -> bytes:
        """The envelope `data` under the header `renewal` (for open(), which checks it)."""
        if not renewal.startswith(ENVELOPE_MAGIC) or renewal.find(b"\n") != len(renewal) - 1:
            raise SignatureError("a renewal is one signature header", reason="malformed")
        return renewal + unwrap(data)

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


@dataclass(slots=True)
class _Renewal:
    endpoint: str
    #: The envelope as the holder took it, or as it last renewed it (what it vouches for).
    envelope: bytes
    #: When it is renewed next (monotonic seconds).
    due: float


class Renewals:
    """The signed requests a receiver holds and renews while it holds them (see the module
    docstring). The first renewal comes `first_after_s` after the take (a quick call costs
    nothing), then one every `every_s`; each is valid for twice that, so whenever the holder
    falls silent, what it held stays valid for `every_s` at least."""

    def __init__(self, first_after_s: float, every_s: float) -> None:
        self.first_after_s = first_after_s
        self.every_s = every_s
        self._held: dict[str, _Renewal] = {}
        self._lock = threading.Lock()

    def hold(self, request_id: str, endpoint: str, envelope: bytes, now: float) -> None:
        with self._lock:
            self._held[request_id] = _Renewal(endpoint, envelope, now + self.first_after_s)

    def due(self, now: float, holding: Callable[[str], bool]) -> list[tuple[str, str, bytes]]:
        """(request id, endpoint, envelope) of what is due for renewal; what this node no
        longer holds is forgotten."""
        with self._lock:
            for request_id in [i for i in self._held if not holding(i)]:
                del self._held[request_id]
            return [
                (request_id, held.endpoint, held.envelope)
                for request_id, held in self._held.items()
                if held.due <= now
            ]

    def renewed(self, renewed: dict[str, bytes | None], now: float) -> None:
        """Schedule the next renewals: request id → its envelope as renewed (the next renewal
        starts from it, so it outlives a rotation of the key that first signed it), or None
        when it could not be renewed (it is tried again a period later)."""
        with self._lock:
            for request_id, envelope in renewed.items():
                held = self._held.get(request_id)
                if held is not None:
                    held.due = now + self.every_s
                    held.envelope = envelope or held.envelope
