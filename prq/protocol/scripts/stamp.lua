--[[ stamp: write a sender's stamp on an endpoint, for a node that knows none there it can rely
on (its first enqueue there, one after a loss it declared, or one idle past half a list TTL),
before it enqueues: an enqueue carries the stamp so that a replay of it after a loss finds it
low (enqueue.lua), which a stamp written by the enqueue itself could not tell. Each stamp
written here goes to a key of a new generation: an enqueue still on its way with an older
stamp finds its own key as the loss left it, not as a write since made it.

KEYS[1]  the sender's stamp  prq:{e}:ss:<node>:<n> (the server's clock at its last enqueue
         there, µs)
ARGV[1]  its TTL, ms (the list TTL)

Reply: the stamp written.

Invariants:
- the stamp is max(what it held + 1, the clock): on one server's data it only grows
  (enqueue.lua writes it by the same rule, and judges it), so an enqueue carrying it later
  finds it lower only after Redis lost or rolled back data
- it lives a list TTL from the last step that wrote it; nothing else is written
]]
-- include: _sequence
local held = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local stamp = math.max(held + 1, clock_us())
redis.call('SET', KEYS[1], number_text(stamp), 'PX', ARGV[1])
return stamp
