--[[ _handoff: hand a request straight to an idle receiver's parked take, and take it back when
that receiver does not confirm it in time. Needs _queue (included before it).
Scripts include this file where they say `-- include: _handoff`; it is not a script of its own.

A hand-off is not a pickup. It leaves the request in state "handed": owned by the parked take's
token, listed on that token's receipt, and due for confirmation by "ho" (server ms). The
receiver confirms by collecting its receipt (take.lua), which makes the request "taken"; only
then does it run it. A receiver that died while parked (SIGKILL, a crash, a plain script stopped
by SIGTERM) never confirms: the request is reclaimed (`reclaim`) by whoever looks first after
the deadline (the caller's poll, any take of the endpoint, a receiver giving it back) and goes
to the next live park or back to the front of its level. It never ran, so it counts no attempt
and its caller is never told "maybe executed".

`k` names the keys: hash (the request), parked, parks, receipt_prefix, run (in-flight zset),
handoffs (zset: handed id -> confirm deadline), levels and prefix (_queue.lua); `o` the
settings: confirm_ms, in_flight_ttl, receipt_ttl, list_ttl, extra_ttl, pulse (the endpoint's
channel) and node_prefix (`prq:node:`).
]]

-- the oldest live park, removed from the parked list: token and node; nil when none is live
-- (stale parks met on the way are dropped: their receivers stopped waiting, or died)
local function pop_live_park(k, now)
  for _ = 1, 100 do
    local token = redis.call('LPOP', k.parked)
    if not token then return nil end
    local park = redis.call('HGET', k.parks, token)
    redis.call('HDEL', k.parks, token)
    local sep = park and string.find(park, '|', 1, true)
    if sep then
      local until_ms = tonumber(string.sub(park, sep + 1))
      if until_ms and until_ms >= now then return token, string.sub(park, 1, sep - 1) end
    end
  end
  return nil
end

-- hand request `id` (its hash written, in any state) to a parked token on `node`
local function hand_to(k, id, token, node, now, o)
  redis.call('HSET', k.hash, 'st', 'handed', 'own', token, 'rcv', node,
    'ho', now + tonumber(o.confirm_ms))
  redis.call('PEXPIRE', k.hash, o.in_flight_ttl)
  redis.call('ZADD', k.run, now, id)  -- it holds an in-flight slot until confirmed or reclaimed
  redis.call('PEXPIRE', k.run, o.list_ttl)
  redis.call('ZADD', k.handoffs, now + tonumber(o.confirm_ms), id)
  redis.call('PEXPIRE', k.handoffs, o.list_ttl)
  local receipt = k.receipt_prefix .. token
  redis.call('RPUSH', receipt, id)
  redis.call('PEXPIRE', receipt, o.receipt_ttl)
  redis.call('PUBLISH', o.node_prefix .. node, 't|' .. token .. '|' .. id)
end

-- hand `id` to the oldest live park; the token, or nil when no park is live
local function hand_off(k, id, now, o)
  local token, node = pop_live_park(k, now)
  if token then hand_to(k, id, token, node, now, o) end
  return token
end

-- drop every park of `node`: it did not confirm a hand-off in time, so it is dead or stuck; a
-- live one parks again on its next take (at most a poll interval later)
local function forget_parks_of(k, node)
  local parks = redis.call('HGETALL', k.parks)
  local prefix = node .. '|'
  for i = 1, #parks, 2 do
    if string.sub(parks[i + 1], 1, #prefix) == prefix then
      redis.call('HDEL', k.parks, parks[i])
      redis.call('LREM', k.parked, 1, parks[i])
    end
  end
end

-- take back a hand-off: to the next live park, else to the front of its level; "handed" or
-- "queued". `overdue`: its receiver did not confirm it in time, so the parks of its node go too
-- (else the receiver gives it back itself). The caller checked that the request is "handed".
local function reclaim(k, id, now, o, overdue)
  local node, pri, pd = unpack(redis.call('HMGET', k.hash, 'rcv', 'pri', 'pd'))
  redis.call('ZREM', k.handoffs, id)
  redis.call('ZREM', k.run, id)
  if overdue and node then forget_parks_of(k, node) end
  if hand_off(k, id, now, o) then return 'handed' end
  redis.call('HSET', k.hash, 'st', 'queued')
  redis.call('HDEL', k.hash, 'own', 'rcv', 'ho')
  local ttl = math.max(0, (tonumber(pd) or now) - now) + tonumber(o.extra_ttl)
  redis.call('PEXPIRE', k.hash, ttl)
  queue_push_front(k.levels, k.prefix, pri or '0', id, o.list_ttl, now, ttl)
  redis.call('PUBLISH', o.pulse, '')
  return 'queued'
end

-- give back a request that a take handed to a token and that its receiver never collected (the
-- take was cut short: cancelled, or its node shut down): it never ran, so it goes back like a
-- hand-off, its attempt not counted, with a pickup window afresh if its own has passed.
-- `k.lease` names the at_least_once in-flight set. The caller checked that it is "taken".
local function untake(k, id, now, o)
  local att, pd, pw = unpack(redis.call('HMGET', k.hash, 'att', 'pd', 'pw'))
  att = (tonumber(att) or 1) - 1
  if att > 0 then redis.call('HSET', k.hash, 'att', att) else redis.call('HDEL', k.hash, 'att') end
  if (tonumber(pd) or 0) < now then
    redis.call('HSET', k.hash, 'pd', now + (tonumber(pw) or tonumber(o.confirm_ms)))
  end
  redis.call('HDEL', k.hash, 'tk')
  redis.call('ZREM', k.lease, id)
  return reclaim(k, id, now, o, false)
end

-- reclaim up to 16 hand-offs whose confirmation is overdue; how many
local function reclaim_overdue(k, now, o)
  local n = 0
  for _, id in ipairs(redis.call('ZRANGE', k.handoffs, '-inf', now, 'BYSCORE', 'LIMIT', 0, 16)) do
    k.hash = k.request_prefix .. id
    if record_get(k.hash, {'st'})[1] == 'handed' then
      reclaim(k, id, now, o, true)
      n = n + 1
    else
      redis.call('ZREM', k.handoffs, id)
    end
  end
  return n
end
