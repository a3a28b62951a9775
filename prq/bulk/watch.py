"""The loss watch of a bulk client (LossWatch): a counter beside an endpoint's records, stepped
with canary.lua, that tells a reader or a writer whether Redis lost data since it started; and
the job mark that tells the writers of one job (the tasks of a Spark action) apart by the
generation of Redis's data they wrote into (WatchStart, may_have_lost).

Why both. A watch sees a loss that comes between its start and its last step: what one writer
wrote in that window may be gone. The tasks of a job write one after another, though, and a
loss that comes while none of them writes (after one task's last batch, before the next one's
first) takes the rows of the tasks before it, unseen by any watch. So each task, as it starts
its watch, also joins the job's mark (prq:{e}:lw:job.<token>): it writes a random value there
unless the key exists, and reads what it holds, the mark's *generation*. A loss takes the mark
too; the next task to start writes a new one. Tasks that saw an older generation than the one
the last task to start saw wrote before a loss, and so did those that joined the generation of
a task whose watch saw a loss: their rows may be gone (`may_have_lost`).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

from prq.core.errors import SerializationError
from prq.core.keys import EndpointKeys, KeySchema, ledger_token
from prq.protocol.effects import Call, Reply
from prq.protocol.scripts.liveness import canary_call, fresh_canary, parse_canary

__all__ = [
    "LOSS_WATCH_TTL_S",
    "LossWatch",
    "WatchStart",
    "job_mark_calls",
    "mark_key",
    "may_have_lost",
    "parse_generation",
]

#: How long a loss watch (and a job mark) outlives its last step.
LOSS_WATCH_TTL_S = 3600.0
_TTL_MS = int(LOSS_WATCH_TTL_S * 1000)


@dataclass(slots=True)
class LossWatch:
    """Tells a reader of outcomes whether Redis lost data while it waited, so that a request
    whose record is missing is known lost (DataLoss) rather than expired; and a writer
    (`BulkClient.enqueue_many(..., watch=)`, `enqueue_encoded(..., watch=)`) whether Redis
    lost data while it wrote, so that it knows some requests it counted as accepted may be
    gone (`BulkResult.data_loss`).

    A counter beside the endpoint's records (prq:{e}:lw:<token>), stepped by the same script
    as a node's data-loss canary (scripts/canary.lua) with every read of outcomes
    (`BulkClient.outcomes(..., watch=)`), after the records, and with every round trip of an
    enqueue given it, after its writes: a value that is not the last one plus one means the
    key was lost or went back (a restart without persistence, a flush, a failover to a
    replica that missed writes). A step sent again (a lost reply, a script cache reloaded)
    finds itself already taken, so a replay never hides a loss nor invents one. Start it
    (`BulkClient.start_watch`) before sending what it watches (an enqueue given a watch not
    started starts it in its first round trip, before its writes); it lives an hour past its
    last step, and one not stepped for that long reads as lost.
    """

    token: str = field(default_factory=lambda: secrets.token_urlsafe(8))
    #: The counter's value at the last read (None: not started).
    count: int | None = None
    #: The value it starts at (drawn at random: canary.lua).
    fresh: int = field(default_factory=fresh_canary)
    #: Redis lost data since the watch started (stays True).
    lost: bool = False
    #: The endpoint whose records' server (on a cluster, master) it watches: the one it was
    #: started on (None: not started).
    endpoint: str | None = None
    #: The job whose mark it joined at its start (`BulkClient.start_watch(..., job=)`), renewed
    #: by each of its steps after writes (None: none).
    job: str | None = None

    def saw(self, value: int) -> None:
        """Take the counter's value a read returned."""
        if self.count is not None and value != self.count + 1:
            self.lost = True
        if not self.lost:
            self.count = value

    def keys(self, schema: KeySchema, endpoint: str) -> EndpointKeys:
        """The keys of the endpoint it watches: its own once started, else `endpoint`'s (it is
        then started there)."""
        if self.endpoint is None:
            self.endpoint = endpoint
        return schema.endpoint(self.endpoint)

    def step_call(self, keys: EndpointKeys) -> Call:
        """The one step of this watch: its start when not started, else from its count on."""
        following = self.fresh if self.count is None else self.count + 1
        return canary_call(keys.loss_watch(self.token), _TTL_MS, self.count, following)

    def around_calls(self, keys: EndpointKeys) -> tuple[list[Call], list[Call]]:
        """(before, after): the calls that watch the writes sent between them in one round
        trip: its start, when not started, before them, and a step after them (and its job
        mark's renewal, when it joined one)."""
        key = keys.loss_watch(self.token)
        renew = [Call(("PEXPIRE", mark_key(keys, self.job), _TTL_MS))] if self.job else []
        if self.count is not None:
            return [], [canary_call(key, _TTL_MS, self.count, self.count + 1), *renew]
        start = canary_call(key, _TTL_MS, None, self.fresh)
        return [start], [canary_call(key, _TTL_MS, self.fresh, self.fresh + 1), *renew]

    def read(self, before: Sequence[Reply], after: Sequence[Reply]) -> None:
        """Take the replies of `around_calls`' calls."""
        for reply in [*before, *after[:1]]:
            self.saw(parse_canary(reply)[0])


@dataclass(frozen=True, slots=True)
class WatchStart:
    """What starting a loss watch read (`BulkClient.start_watch`)."""

    #: The server's clock at the start, microseconds.
    clock_us: int
    #: The generation of the job's mark the watch joined (0: none named).
    generation: int = 0


def mark_key(keys: EndpointKeys, job: str) -> str:
    """The key of `job`'s mark on this endpoint."""
    return keys.loss_watch(f"job.{ledger_token(job)}")


def job_mark_calls(keys: EndpointKeys, job: str) -> list[Call]:
    """Join the mark of `job` on this endpoint: write a generation of one's own unless one is
    there (atomic: the first writer's wins), renew it, and read it (the last call's reply).
    The writers' steps renew it too (LossWatch.job): it lives an hour past the job's last."""
    key = mark_key(keys, job)
    mine = fresh_canary()
    return [
        Call(("SET", key, str(mine), "NX", "PX", _TTL_MS)),
        Call(("PEXPIRE", key, _TTL_MS)),
        Call(("GET", key)),
    ]


def parse_generation(reply: Reply) -> int:
    """The generation a job mark's GET read."""
    text = reply.decode() if isinstance(reply, bytes) else reply
    if not isinstance(text, str) or not text.isdigit():
        raise SerializationError(f"unexpected job mark reply from Redis: {reply!r:.200}")
    return int(text)


def may_have_lost(writers: Sequence[tuple[WatchStart | None, bool]]) -> list[bool]:
    """For each writer of one job, (what starting its watch read, None when it wrote nothing;
    whether its watch saw a loss): whether what it wrote may be gone. So it may when

    - its own watch saw a loss;
    - it joined a generation of the job's mark other than the one the last writer to start
      joined: a loss took the mark after it joined (a writer that started later found it
      gone);
    - it joined the generation of a writer whose watch saw a loss: it started before that
      loss took the mark, and may have written before it (it may also have ended before it,
      unseen by its own watch).

    Conservative: a writer that started before a loss but wrote only after it is counted too.
    """
    known = [start for start, _ in writers if start is not None]
    if not known:
        return [lost for _, lost in writers]
    latest = max(known, key=lambda start: start.clock_us).generation
    seen_lost = {start.generation for start, lost in writers if lost and start is not None}
    return [
        lost
        or (start is not None and (start.generation != latest or start.generation in seen_lost))
        for start, lost in writers
    ]
