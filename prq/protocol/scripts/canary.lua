--[[ canary: step this node's data-loss canary, once per check, replay-safe.

KEYS[1]  the node's canary     prq:canary:{<node>}
ARGV[1]  TTL, ms
ARGV[2]  the value the node saw last (-1: none yet, write a fresh canary)

Reply: the canary's value after this call. The node expects its last value + 1; anything else
means Redis lost data (0: the canary is gone, after a restart or a flush) or rolled back (an
older value: a restore from a snapshot, or a failover to a stale replica).

Invariants:
- the canary only moves from last to last + 1, so a replay of the same check (a retry after a
  lost reply) returns last + 1 again instead of stepping twice
- value and TTL are written together
]]
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local last = tonumber(ARGV[2])
if last < 0 then
  current = current + 1
  redis.call('SET', KEYS[1], current, 'PX', ARGV[1])
  return current
end
if current == last then
  current = last + 1
  redis.call('SET', KEYS[1], current, 'PX', ARGV[1])
elseif current == last + 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return current
