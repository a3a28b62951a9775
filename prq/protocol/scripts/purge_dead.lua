--[[ purge_dead: drop dead letters, named ones or all.

KEYS[1]  dead-lettered ids     prq:{e}:dead
KEYS[2]  their details         prq:{e}:deadm
KEYS[3]  their stored bytes    prq:{e}:deadb
ARGV     the ids to drop; none: drop them all

Reply: how many dead letters were dropped.

Invariants:
- an id is dropped from all three keys together; ids that are not dead letters are ignored
]]
if #ARGV == 0 then
  local n = redis.call('ZCARD', KEYS[1])
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
  return n
end
local n = redis.call('ZREM', KEYS[1], unpack(ARGV))
redis.call('HDEL', KEYS[2], unpack(ARGV))
redis.call('HDEL', KEYS[3], unpack(ARGV))
return n
