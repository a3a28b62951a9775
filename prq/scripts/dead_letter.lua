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

Invariants:
- the three keys always name the same ids: an id is added to, and dropped from, all three
- the zset's order is the order of arrival (scores strictly increase)
- bounded: nothing older than the TTL stays, and at most ARGV[6] entries (dropped oldest first,
  at most 1,000 per call beyond the one added, so one call stays short)
]]
local now, ttl, cap = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
-- scores strictly increase, so "newest first" and "oldest dropped first" follow the order of
-- arrival even within one millisecond
local score = now
local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if top[2] and tonumber(top[2]) >= score then score = tonumber(top[2]) + 0.001 end
redis.call('ZADD', KEYS[1], score, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])

local function drop(ids)
  if #ids > 0 then
    redis.call('ZREM', KEYS[1], unpack(ids))
    redis.call('HDEL', KEYS[2], unpack(ids))
    redis.call('HDEL', KEYS[3], unpack(ids))
  end
end

drop(redis.call('ZRANGE', KEYS[1], '-inf', '(' .. (now - ttl), 'BYSCORE', 'LIMIT', 0, 1000))
local over = redis.call('ZCARD', KEYS[1]) - cap
if over > 0 then
  drop(redis.call('ZRANGE', KEYS[1], 0, math.min(over, 1000) - 1))
end
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ttl) end
return redis.call('ZCARD', KEYS[1])
