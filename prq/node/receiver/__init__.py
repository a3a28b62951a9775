"""The receiver half of a node: what it does for the requests it takes and holds.

- held: what it holds (`_held`: id → PendingRequest with the owner token that answering
  needs), its bookkeeping of takes and runs, and giving it all back on shutdown;
- signatures: checking taken requests' signatures, and renewing those of held ones;
- taking: a take, and deciding what of it may run;
- answering: answering held requests, and what an answer's outcome leaves to clean up.

Each is a mixin of `QueueBase` (prq.node.base) over the node's core (prq.node.core); none
knows the sender half (prq.node.sender). Nothing here does I/O: the facades drive the flows.
"""
