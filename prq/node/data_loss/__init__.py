"""Noticing that Redis lost or rolled back its state.

Two signs, checked every `data_loss_check_interval_s` (and at once when a wait finds its request
gone):
- the node's canary (canary.lua) must read last + 1 at every check; gone means a restart or a
  flush, an older value means a rollback (restore from an old snapshot, failover to a stale
  replica) that would leave a surviving canary in place. One check at a time steps the
  canaries: a check asked for while one is on its way reads the counters only;
- every endpoint's enqueue counter must never go down; the node remembers the highest value it
  saw (its *floor*: from its enqueues, its takes and its checks), and a reading must not be
  lower than the floor the node knew when it sent the reading (replies of concurrent enqueues
  arrive in any order, so only a reading sent after them can tell a rollback).

An enqueue counter expires, and that is no loss: enqueues set its TTL to a list TTL
(`list_ttl_s`, 1 day), so an endpoint nobody enqueues on for that long loses its counter, and
the next enqueue starts again from 1. So that a floor is never compared with a counter that
expired in its own time:
- each check also refreshes the TTL of every counter it reads (PEXPIRE, which does nothing to a
  counter that is gone: one lost to a flush or a restore stays lost, and the canary tells a
  flush anyway). A counter lives as long as some node compares against it.
- a node *vouches* for a counter for half a list TTL after sending a check that found and
  refreshed it; the other half covers the check's own delays (retries, a slow reply). A floor
  that is not vouched for is not compared: the node was out of touch (Redis away, the node
  paused), or has not checked a counter it just met (a new endpoint brings a check at once).
- a floor whose vouching lapsed starts a new *life* of the counter: it may have expired and
  started again, so its sequence numbers repeat, and the receiver's memories of them (what it
  took, prq.node.receiver.taken; what it ran, prq.node.receiver.ran) begin afresh with the
  life. A life is a number that never repeats on one node.
- a node stops reading, refreshing and remembering the counter of an endpoint it has not used
  (enqueued on, taken from, held or waited on) for a list TTL; the counter then expires a list
  TTL after the last refresh, and the endpoint starts a new life if the node uses it again.

This needs `data_loss_check_interval_s` below half of `list_ttl_s` (60 s and 12 h by default):
with a longer interval no floor stays vouched for from one check to the next, so only the
canary tells a loss and every check starts a new life.

On either sign the node declares data loss: its `epoch` advances, so every call in flight fails with
DataLoss, every request it holds is cancelled with reason `data_loss`, and the next check writes a
fresh canary and learns the counters anew (a declaration keeps the lives: prq.node.receiver.taken
still refuses what the rolled-back Redis hands out again). What that Redis still queues from before
the loss (*ghosts*: a stale replica misses the takes and answers of requests that ran) must not run
again, on this node or any other: a reading of an endpoint's counter made after the loss is at least
every ghost's sequence number, so takes refuse, and cancel with reason `data_loss`, the requests
numbered up to it. The first such reading is, on one server, the declaring check's own (read behind
the canary, on the same connection), or the reading that went back; otherwise the first one sent
after the declaration (a take's or a check's: one sent before it may show the counter before the
loss, and mark requests queued since). Requests queued between the loss and that reading are refused
with the ghosts (their callers get DataLoss, which is retryable): on one server only those queued
before the check that saw the loss; on a cluster also those queued within the round trip after it.
Pure, and thread-safe (the blocking facade takes from several threads): the facade's watch loop
sends the calls and reports the replies.

On a Redis Cluster each master can lose its data alone (flushed, restarted empty, failed over
to a stale replica), so a loss has a *scope*: the slots of the master that lost it. The node
keeps a canary on every master (a key whose slot that master serves, found from the slot table
the client keeps), and a sign on one master declares data loss for that master's slots only:
the calls and held requests of endpoints there fail, the others go on. Each endpoint's epoch is
that of the last declaration whose scope held its slot. A canary stays where it is while its
master keeps the slot (a failover keeps the key on the promoted replica, so a stale one shows
as a rollback); a master without one gets a fresh one.

The watch is one class, `DataLossWatch` (watch), built from mixins by concept:
- scopes: where a loss is: the epoch of each slot, the scope of a master, its canary;
- counters: what the node knows of each endpoint's enqueue counter (floors, lives, ghosts);
- checks: a check's calls, and judging its replies;
- watch: the watch's state at start, and declaring a loss.
"""
