--[[ _dead: keep a request that must not run, for an operator to list, replay or purge.
Scripts include this file where they say `-- include: _dead`; it is not a script of its own.

The three keys always name the same ids: a zset of ids by when (ms), a hash of their details
(JSON: reason, attempts, at, and priority and producer when known) and a hash of their stored
bytes. Scores strictly increase, so "newest first" and "oldest dropped first" follow the order
of arrival even within one millisecond. Bounded: nothing older than ttl stays, and at most cap
entries (dropped oldest first, at most 1,000 per call beyond the one added).
]]
local function dead_letter(dead, id, details, body, now, ttl, cap)
  local ids, info, bodies = dead[1], dead[2], dead[3]
  now, ttl, cap = tonumber(now), tonumber(ttl), tonumber(cap)
  local score = now
  local top = redis.call('ZRANGE', ids, -1, -1, 'WITHSCORES')
  if top[2] and tonumber(top[2]) >= score then score = tonumber(top[2]) + 0.001 end
  redis.call('ZADD', ids, score, id)
  redis.call('HSET', info, id, details)
  redis.call('HSET', bodies, id, body)

  local function drop(gone)
    if #gone > 0 then
      redis.call('ZREM', ids, unpack(gone))
      redis.call('HDEL', info, unpack(gone))
      redis.call('HDEL', bodies, unpack(gone))
    end
  end

  drop(redis.call('ZRANGE', ids, '-inf', '(' .. (now - ttl), 'BYSCORE', 'LIMIT', 0, 1000))
  local over = redis.call('ZCARD', ids) - cap
  if over > 0 then
    drop(redis.call('ZRANGE', ids, 0, math.min(over, 1000) - 1))
  end
  for i = 1, 3 do redis.call('PEXPIRE', dead[i], ttl) end
  return redis.call('ZCARD', ids)
end
