"""How a node runs a flow, whoever does its I/O: both facades' drivers (`AsyncDriver._run`,
`BlockingDriver._run`) and the simulation (tests/sim) drive `guarded(node, flow)`, which
wraps the flow in the node's rules and yields what the driver must do.

- Before each effect: once the node is closed, or closing and the flow is not one that goes on
  while it closes (answers, giving back), the flow is closed and QueueShutdown raised (saying
  whether anything was sent); with a call's `mark`, DataLoss is raised as soon as the node
  declared a loss its request may be one of (prq.node.data_loss).
- A prq error the driver throws in (a round trip that failed) is thrown into the flow where it
  waits, so that the flow can say what it means there; QueueShutdown, a round trip cut by
  closing, becomes the node's own shutdown error (the step was sent).
- Any other error thrown in (an asyncio cancel, a KeyboardInterrupt) closes the flow first, so
  that its clean-up (a cut-short take letting go of what it adopted) runs then, not when it is
  collected.
- A DataLoss the flow raises (its request was found gone) is preceded by one more effect,
  `CHECK_DATA_LOSS`: the driver checks for a data loss now, so that a retry starts in the new
  epoch, and sends None back.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Protocol, TypeVar

from prq.core.errors import DataLoss, PrqError, QueueShutdown
from prq.node.data_loss.counters import CallMark
from prq.protocol.effects import Effect, Exec, Flow

__all__ = ["CHECK_DATA_LOSS", "CheckDataLoss", "Guarded", "guarded"]

T = TypeVar("T")


class CheckDataLoss:
    """What `guarded` yields before a DataLoss the flow raised: check for a loss now."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "CHECK_DATA_LOSS"


CHECK_DATA_LOSS = CheckDataLoss()


class Guarded(Protocol):
    """What `guarded` reads of its node (prq.node.base.QueueBase is one)."""

    _closed: bool
    _closing: bool

    def _check_epoch(self, mark: CallMark | None) -> None: ...

    def _shutdown_error(self, sent: bool = False) -> QueueShutdown: ...


def guarded(
    node: Guarded, flow: Flow[T], mark: CallMark | None = None, *, closing_ok: bool = False
) -> Generator[Effect | CheckDataLoss, object, T]:
    """`flow` under the node's rules (the module docstring); its result."""
    reply: object = None
    error: PrqError | None = None
    sent = False
    while True:
        try:
            effect = flow.throw(error) if error is not None else flow.send(reply)
        except StopIteration as stop:
            result: T = stop.value
            return result
        except DataLoss:
            yield CHECK_DATA_LOSS
            raise
        error = None
        if node._closed or (node._closing and not closing_ok):
            flow.close()
            raise node._shutdown_error(sent)
        try:
            node._check_epoch(mark)
        except DataLoss:
            flow.close()
            raise
        if isinstance(effect, Exec):
            sent = True
        try:
            reply = yield effect
        except QueueShutdown:  # closed while the calls were on their way
            error = node._shutdown_error(sent=True)
        except PrqError as exc:
            error = exc
        except BaseException:
            flow.close()
            raise
