"""Noticing that Redis lost or rolled back its data, and refusing what it may hand out again.

One rule carries it (docs/design.md, "Data-loss detection"). A request's sequence number is at
least the server's clock in microseconds when it was enqueued, and on one server's data the
numbers only grow, also when the counter key expires or is flushed (scripts/_sequence.lua). So
a server time before a loss is above every request the lost Redis held and below every request
queued since. A node keeps, per Redis server (per master on a cluster), such a time: its
*fence*. Requests numbered at or below it are *ghosts*: queued before a loss the node declared
there, they may have run already, and a take refuses them (cancelled, reason `data_loss`)
instead of running them. A second loss only raises the fence to a time before it, so whatever
was queued after the last loss runs, however many came before.

What a node keeps:
- per server (master): its canary (key, the value it read last) and the server time of the
  canary's last step it judged (`Canary.good`); the fence and the number of the last
  declaration there (`Mark`: epoch and fence, per slot on a cluster);
- per endpoint: the highest sequence number it read (`floor`: from its enqueues, takes and
  checks) and when it last used the endpoint (forgotten a list TTL after).

The signs, and the fence each gives:
- the canary is not what its last step wrote, at a check (gone: a flush, a restart empty;
  another value: a rollback to an old snapshot or a stale replica): all Redis holds now from
  before the loss is older than the canary's last good step: fence = `Canary.good`;
- a counter present but below the floor (read by a take or a check, or as the last number
  before an enqueue's): Redis went back to before that floor was given, and anything queued
  since got a number above it: fence = the floor;
- a hand-out this node took before comes again (prq.node.receiver.taken): a rollback neither
  showed: fence = the floor (which that take's own reading raised), at least its number.
- a receiver's stamp on an endpoint (scripts/take.lua: the server's clock at its last take
  there, written and judged by every take in the same step) below what its last take wrote,
  or gone: Redis went back behind that take, and the take took nothing: fence = that stamp.
  It is the one sign judged in the step that hands requests out, so no ghost of a rollback
  behind the receiver's last take runs before the loss is declared (a check comes later, and
  another node's enqueue lifts the counter meanwhile); a take sent after another sign of the
  same loss was declared raises that declaration's fence instead of declaring it again.
A counter that is missing is no sign: it expires when an endpoint is idle for a list TTL, and a
flush shows in the canary. A node that read it lately checks at once, and so does one whose
call or held request finds its record gone, or whose pub/sub link came back (Redis may have
restarted).

Declaring a loss there: the epoch advances (a reading sent before the declaration says nothing
any more), the fence rises, floors are forgotten; a canary steps on from the value its check
read (any other sign has them written afresh at the next check, which comes at once);
a call in flight fails with DataLoss unless its request is numbered above the fence, a held
request at or below it is cancelled (`data_loss`), and every other wait and held request reads
Redis at once (one whose record the loss took finds it gone).

Limits, each a consequence of the rule: a node knows only the losses it saw (one started after
a rollback runs its ghosts); a rollback to a moment after the last canary step shows only in a
counter read before the next enqueue there, or in a hand-out repeated to the same receiver; of
two losses between two checks, the second a rollback to a moment after the first, what was
queued between them and ran may run again;
the clocks of a master and the replica promoted in its place should agree (requests queued
within their difference after the failover are refused); and an endpoint given more than a
million numbers a second runs its numbers ahead of the clock, so a ghost may escape a fence.

On a Redis Cluster each master can lose its data alone, so a loss has a *scope*: the slots of
the master that lost it. The node keeps a canary on every master, and a sign on one master
declares for that master's slots only. The data-loss check is pure and thread-safe (the
blocking facade takes from several threads): the node's watch loop sends its calls and reports
the replies.

The watch is one class, `DataLossWatch` (watch), built from mixins by concept:
- scopes: where a loss is: each slot's mark (epoch, fence), a master's scope, its canary;
- counters: the floors of the endpoints' counters, and judging a reading;
- checks: a check's calls, and judging its replies;
- watch: the watch's state at start, and declaring a loss.
"""
