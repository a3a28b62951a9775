"""Every error prq raises.

```
PrqError                      every error has .retryable and .maybe_executed
├── InvalidEndpoint           (also ValueError) caught before anything is written
├── PayloadTooLarge           (also ValueError) caught before anything is written
├── InvalidRequest            (also ValueError) a Request with a field prq does not take
├── SerializationError        bytes that are not a valid prq message
│   └── SignatureError        a message whose signature is missing, wrong or expired
├── ConfigurationError        wrong URL, credentials or TLS set-up; not retried
│   └── InvalidSettings       (also ValueError) QueueSettings / RedisSettings refused
├── QueueUnavailable          Redis unreachable past the retry budget
├── QueueFull                 Redis (or the endpoint) refuses more requests
├── QueueShutdown             the queue object was closed while a call waited
├── DataLoss                  Redis lost or rolled back its state
└── RequestError              carries .request_id and .endpoint
    ├── PickupTimeout         no receiver took the request in time (never ran)
    ├── CallTimeout           the caller's own timeout_s passed
    ├── CancelledBeforePickup
    ├── CancelledAfterPickup
    ├── ReceiverLost          the receiving node stopped sending heartbeats
    ├── RequestExpired        its record expired before the caller read it (its answer, likely)
    └── RemoteError           the service raised; carries the ServerError
```

`retryable` means trying the same call again may succeed. `maybe_executed` means the service may
have run the request: false for everything that is known to fail before pickup.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, JsonValue

__all__ = [
    "CallTimeout",
    "CancelledAfterPickup",
    "CancelledBeforePickup",
    "ConfigurationError",
    "DataLoss",
    "InvalidEndpoint",
    "InvalidRequest",
    "InvalidSettings",
    "PayloadTooLarge",
    "PickupTimeout",
    "PrqError",
    "QueueFull",
    "QueueShutdown",
    "QueueUnavailable",
    "ReceiverLost",
    "RemoteError",
    "RequestError",
    "RequestExpired",
    "SerializationError",
    "SignatureError",
]


class PrqError(Exception):
    """Root of prq's errors."""

    #: Trying the same call again may succeed.
    retryable: bool = False
    #: The service may have run the request.
    maybe_executed: bool = False


class InvalidEndpoint(PrqError, ValueError):
    """The endpoint name is empty, too long, or has a non-printable character."""


class PayloadTooLarge(PrqError, ValueError):
    """A request or response body is over `max_body_bytes`; nothing was written."""

    def __init__(self, message: str, *, size_bytes: int, limit_bytes: int) -> None:
        super().__init__(message)
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes


class _Validation(Protocol):
    """What prq reads of a pydantic ValidationError: its `errors()`, typed by shape."""

    def errors(self, *, include_url: bool = ..., include_input: bool = ...) -> Sequence[Any]: ...


class _Problems(ValueError):
    """A refused set of values: the message names each field and rule, never a value given
    (a value may be a secret); `errors()` lists them as pydantic does (without the values), so
    code written for pydantic's ValidationError reads them the same way."""

    def __init__(self, message: str, *, errors: Sequence[dict[str, Any]] = ()) -> None:
        super().__init__(message)
        self._errors = [dict(error) for error in errors]

    def errors(self) -> list[dict[str, Any]]:
        """Each problem: `loc` (the field's path), `msg`, `type`, as pydantic reports them."""
        return [dict(error) for error in self._errors]


class InvalidRequest(PrqError, _Problems):
    """A Request built with a field prq does not take (an empty method, a priority out of
    range, ...); raised before anything is written. Also a ValueError, as pydantic's
    ValidationError is."""


def problems_text(errors: Sequence[dict[str, Any]]) -> str:
    """`field: rule; ...` for pydantic's errors, without the values given."""
    return "; ".join(
        ".".join(str(part) for part in error.get("loc", ())) + ": " + str(error.get("msg", ""))
        if error.get("loc")
        else str(error.get("msg", ""))
        for error in errors
    )


@contextmanager
def typed_validation(error: type[_Problems], what: str) -> Iterator[None]:
    """Turn pydantic's ValidationError raised inside into `error` (a PrqError and a
    ValueError), naming `what` was refused; the pydantic error stays its `__cause__`."""
    from pydantic import ValidationError

    try:
        yield
    except ValidationError as exc:
        validation: _Validation = exc
        errors = [dict(e) for e in validation.errors(include_url=False, include_input=False)]
        raise error(f"invalid {what}: {problems_text(errors)}", errors=errors) from exc


class SerializationError(PrqError):
    """Bytes read from Redis (or given by a caller) are not a valid prq message."""


class SignatureError(SerializationError):
    """With a signing key configured, a message that does not carry a valid signature: `reason`
    is "unsigned", "malformed", "unknown_key" (signed with a key this node does not hold, or a
    previous key past its grace window), "mismatch" (forged or tampered with) or "expired".

    A caller gets it for a response that fails the check: the request may have run."""

    maybe_executed = True

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class ConfigurationError(PrqError):
    """The connection settings are wrong (URL, credentials, permissions, TLS); not retried."""


class InvalidSettings(ConfigurationError, _Problems):
    """QueueSettings or RedisSettings refused a value (given, or read from a PRQ_* variable):
    `errors()` names each field. Also a ValueError, as pydantic's ValidationError is."""


class QueueUnavailable(PrqError):
    """Redis could not be reached within the retry budget."""

    retryable = True

    def __init__(self, message: str, *, maybe_executed: bool = False) -> None:
        super().__init__(message)
        self.maybe_executed = maybe_executed


class QueueFull(PrqError):
    """Redis or the endpoint refuses more requests right now."""

    retryable = True


class QueueShutdown(PrqError):
    """The queue was closed while the call was waiting."""

    retryable = True

    def __init__(self, message: str, *, maybe_executed: bool = False) -> None:
        super().__init__(message)
        self.maybe_executed = maybe_executed


class DataLoss(PrqError):
    """Redis lost or rolled back the state of an in-flight request."""

    retryable = True
    maybe_executed = True

    def __init__(self, message: str, *, request_id: str | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


class RequestError(PrqError):
    """An error about one request; carries its id and endpoint."""

    def __init__(self, message: str, *, request_id: str, endpoint: str) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.endpoint = endpoint


class PickupTimeout(RequestError):
    """No receiver picked the request up in time; it was withdrawn and never runs."""

    retryable = True


class CallTimeout(RequestError):
    """The caller's `timeout_s` passed before a response arrived."""

    retryable = True

    def __init__(
        self, message: str, *, request_id: str, endpoint: str, maybe_executed: bool
    ) -> None:
        super().__init__(message, request_id=request_id, endpoint=endpoint)
        self.maybe_executed = maybe_executed


class CancelledBeforePickup(RequestError):
    """The request was withdrawn before any receiver took it."""


class CancelledAfterPickup(RequestError):
    """The request was cancelled after a receiver took it; the service may have run it."""

    maybe_executed = True


class ReceiverLost(RequestError):
    """The node holding the request stopped sending heartbeats."""

    retryable = True
    maybe_executed = True


class RequestExpired(RequestError):
    """Redis no longer holds the request, and the caller had not looked for longer than an
    answer it waits for is surely kept (QueueSettings.waited_response_ttl_s): the record most
    likely expired with its answer before the caller read it (not DataLoss, which says Redis
    lost data). The request may have run."""

    retryable = True
    maybe_executed = True


class ServerError(BaseModel):
    """What a service raised, as carried in `Response.error`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: str
    message: str
    details: JsonValue = None
    retryable: bool = False


class RemoteError(RequestError):
    """The service ran the request and raised."""

    maybe_executed = True

    def __init__(self, error: ServerError, *, request_id: str, endpoint: str) -> None:
        super().__init__(f"{error.type}: {error.message}", request_id=request_id, endpoint=endpoint)
        self.error = error
        self.retryable = error.retryable
