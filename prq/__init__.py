"""prq: a Redis-backed distributed pending-request queue.

Any node calls `queue_and_wait(request)` (or `call(...)`) for a polling endpoint; the node that
serves the endpoint dequeues the request, runs it, and applies the response. Optional
integrations live outside this namespace: `prq.embedded`, `prq.spark`.
"""

from prq.config import QueueSettings, RedisSettings
from prq.dead import DeadLetter
from prq.errors import (
    CallTimeout,
    CancelledAfterPickup,
    CancelledBeforePickup,
    ConfigurationError,
    DataLoss,
    InvalidEndpoint,
    InvalidRequest,
    InvalidSettings,
    PayloadTooLarge,
    PickupTimeout,
    PrqError,
    QueueFull,
    QueueShutdown,
    QueueUnavailable,
    ReceiverLost,
    RemoteError,
    RequestError,
    SerializationError,
    SignatureError,
)
from prq.limits import EndpointLimits
from prq.models import (
    DeliveryInfo,
    PendingRequest,
    Request,
    RequestState,
    RequestStatus,
    Response,
    ServerError,
)
from prq.node import QueueStats
from prq.queue import AsyncQueue
from prq.send import BlockingSendHandle, SendHandle
from prq.sync import Queue
from prq.worker import current_request

#: The one place prq's version is written: pyproject.toml reads it from here (setuptools' dynamic
#: version), `prq --version` prints it and the admin service's OpenAPI document states it.
__version__ = "0.1.0"

__all__ = [
    "AsyncQueue",
    "BlockingSendHandle",
    "CallTimeout",
    "CancelledAfterPickup",
    "CancelledBeforePickup",
    "ConfigurationError",
    "DataLoss",
    "DeadLetter",
    "DeliveryInfo",
    "EndpointLimits",
    "InvalidEndpoint",
    "InvalidRequest",
    "InvalidSettings",
    "PayloadTooLarge",
    "PendingRequest",
    "PickupTimeout",
    "PrqError",
    "Queue",
    "QueueFull",
    "QueueSettings",
    "QueueShutdown",
    "QueueStats",
    "QueueUnavailable",
    "ReceiverLost",
    "RedisSettings",
    "RemoteError",
    "Request",
    "RequestError",
    "RequestState",
    "RequestStatus",
    "Response",
    "SendHandle",
    "SerializationError",
    "ServerError",
    "SignatureError",
    "__version__",
    "current_request",
]
