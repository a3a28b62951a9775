--[[ dead_letter: keep a request that must not run (undecodable bytes, attempts exhausted) with
its reason, for an operator to list, replay or purge.

KEYS[1]  dead-lettered ids     prq:{e}:dead     (zset: id -> when, ms)
KEYS[2]  their details         prq:{e}:deadm    (hash: id -> JSON: reason, attempts, ...)
KEYS[3]  their stored bytes    prq:{e}:deadb    (hash: id -> the request's body as stored)
ARGV[1]  request id
ARGV[2]  details (JSON)
ARGV[3]  the stored bytes
ARGV[4]  now_ms
ARGV[5]  TTL of a dead letter, ms (entries older than this are dropped; the keys' TTL)
ARGV[6]  most dead letters kept (the oldest beyond it are dropped)

Reply: the number of dead letters kept after this one.

Invariants (see _dead.lua):
- the three keys always name the same ids: an id is added to, and dropped from, all three
- the zset's order is the order of arrival (scores strictly increase)
- bounded: nothing older than the TTL stays, and at most ARGV[6] entries (dropped oldest first,
  at most 1,000 per call beyond the one added, so one call stays short)
]]
-- include: _dead
return dead_letter(KEYS, ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
