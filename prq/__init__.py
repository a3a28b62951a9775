"""prq: a Redis-backed distributed pending-request queue.

Any node calls `queue_and_wait(request)` (or `call(...)`) for a polling endpoint; the node that
serves the endpoint dequeues the request, runs it, and applies the response. Optional
integrations live outside this namespace: `prq.embedded`, `prq.spark`.
"""

from prq._version import __version__
from prq.core.config import QueueSettings, RedisSettings
from prq.core.errors import (
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
    RequestExpired,
    SerializationError,
    ServerError,
    SignatureError,
)
from prq.core.lifecycle import DeliveryInfo, PendingRequest, RequestState, RequestStatus
from prq.core.models import Request, Response
from prq.facade.asyncio_queue import AsyncQueue
from prq.facade.blocking_queue import Queue
from prq.facade.send import BlockingSendHandle, SendHandle
from prq.node.base import QueueStats
from prq.protocol.dead import DeadLetter
from prq.protocol.limits import EndpointLimits
from prq.serve.current import current_request

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
    "RequestExpired",
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
