"""The settings' defaults and the shares their checks hold them to (prq.core.config reads
them; README, "Configuration", lists them)."""

from __future__ import annotations

#: Where to connect when neither an argument nor PRQ_REDIS_URL says otherwise.
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
#: How long a request may wait for a receiver to pick it up.
DEFAULT_PICKUP_TIMEOUT_S = 120.0
#: How long one `dequeue` waits for work before returning None.
DEFAULT_DEQUEUE_TIMEOUT_S = 30.0
#: How often a wait that listens for a pulse also polls Redis (pulses can be lost).
DEFAULT_POLL_INTERVAL_S = 5.0
#: Heartbeat rate for both roles while a picked-up request is in flight.
DEFAULT_HEARTBEAT_INTERVAL_S = 15.0
#: No heartbeat before this, so fast calls cost nothing.
DEFAULT_HEARTBEAT_INITIAL_DELAY_S = 7.0
#: Receiver silent this long: the caller gets ReceiverLost.
DEFAULT_RECEIVER_TIMEOUT_S = 60.0
#: Sender silent this long: the receiver's request is cancelled (sender_lost).
DEFAULT_SENDER_TIMEOUT_S = 90.0
#: How often each node steps its canary and reads the sequence numbers of its endpoints.
DEFAULT_DATA_LOSS_CHECK_INTERVAL_S = 60.0
#: How long one Redis step is retried on connection errors before QueueUnavailable.
DEFAULT_RETRY_BUDGET_S = 30.0
#: How long a request handed straight to an idle receiver waits for that receiver to confirm
#: it before it goes to another receiver (a receiver that died while idle never confirms).
DEFAULT_HANDOFF_CONFIRM_S = 2.0
#: How long a response is kept (for pollers, and for idempotent re-enqueue of the same id).
DEFAULT_RESPONSE_TTL_S = 20 * 60.0
#: The longest a request may ask its answer to be kept (Request.response_ttl_s): a week.
DEFAULT_MAX_RESPONSE_TTL_S = 7 * 24 * 3600.0
#: Request TTL = pickup timeout + this.
DEFAULT_REQUEST_TTL_EXTRA_S = 2 * 60.0
#: TTL of an endpoint's queue keys (levels, lanes, the enqueue counter), renewed by its pushes
#: (a busy level's at most once per eighth of it).
DEFAULT_LIST_TTL_S = 24 * 3600.0
#: How long a cancel marker (or a withdrawn request's tombstone) is kept.
DEFAULT_CANCEL_MARKER_TTL_S = 15 * 60.0
#: Bodies over this go beside Redis (DataStreamStore) instead of inline.
DEFAULT_INLINE_LIMIT_BYTES = 64 * 1024
#: Bodies over this are refused before anything is written.
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
#: Responses up to this size travel inside the response pulse, saving a read.
DEFAULT_PULSE_INLINE_LIMIT_BYTES = 16 * 1024
#: How long a dead letter is kept (and its list, refreshed on every dead letter).
DEFAULT_DEAD_LETTER_TTL_S = 7 * 86400.0
#: Most dead letters kept per endpoint; the oldest go first.
DEFAULT_DEAD_LETTER_MAX = 10_000
#: How many times an at_least_once request may be handed out, by default and at most.
DEFAULT_MAX_ATTEMPTS = 3
MAX_ATTEMPTS_LIMIT = 1000
#: How long closing a queue waits for the requests it holds to be answered.
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0
#: Allowed difference between the nodes' clocks when a signature's expiry is checked.
DEFAULT_SIGNING_CLOCK_SKEW_S = 60.0
#: Shortest signing key accepted (characters).
MIN_SIGNING_KEY_LENGTH = 32
#: Per-attempt socket timeout; bounds how long one hung Redis call can block.
DEFAULT_SOCKET_TIMEOUT_S = 5.0
#: Connect timeout for a new Redis connection.
DEFAULT_CONNECT_TIMEOUT_S = 5.0
#: Connection pool size per node.
DEFAULT_MAX_CONNECTIONS = 256

#: A node's first beat and every next one come within this share of the shorter of the two
#: timeouts, so the other side sees two beats per timeout: one late beat (a slow round trip, a
#: busy loop) does not get a live node declared dead.
HEARTBEAT_SHARE = 0.5
#: A node's data-loss checks come more often than once per this share of `list_ttl_s`: a
#: rollback shows in a node's canary when it goes back past the canary's last step
#: (prq.node.data_loss), so with rarer checks a Redis that went back by less than the age of
#: what it keeps queued could keep every step, and hand out again requests that ran.
DATA_LOSS_CHECK_SHARE = 0.5
#: The longest a serve loop pauses after a failed take before it takes again (prq.serve.pace).
SERVE_BACKOFF_MAX_S = 5.0
#: A step fails with QueueUnavailable at most this long after its retry budget and one socket
#: timeout (prq.transport.budgets).
UNAVAILABLE_GRACE_S = 1.0
