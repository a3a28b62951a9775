--[[ _queue: the scheduling helpers shared by the scripts that queue, take or remove requests.
Scripts include this file where they say `-- include: _queue`; it is not a script of its own.

Layout, for one endpoint (the caller passes LEVELS and PREFIX as KEYS; prq/core/keys.py spells them):
  LEVELS                 zset   priorities whose depth is above 0 (member = score = the priority)
  PREFIX .. p            hash   level p's clock: g = the virtual time of the last id taken from a
                                producer's lane, n = its depth (ids queued, not taken, not
                                removed), x = how many ids its removed set holds, s = the takes
                                it made while a lower level waited, t = its keys' TTL (ms), r =
                                when they were last given it (server ms)
  PREFIX .. p .. ':o'    zset   level p's lanes: 'p' .. producer, scored by the virtual time of
                                that producer's first queued id; 'f' (the front lane) at -inf
  PREFIX .. p .. ':' .. lane   list   that lane's ids, in take order (one entry per id)
  PREFIX .. p .. ':x'    set    ids removed (withdraw, cancel) that are still in a lane

The rules:
- Priority: a take serves the highest level; but while lower levels hold work, every SHARE-th
  take goes to one of them instead, in turn from the next level down (counted by the highest
  level's 's'). The highest level gets SHARE - 1 of every SHARE takes, and each of n lower
  levels with work at least one in SHARE * n: slowed, never starved.
- Fairness within a level (start-time fair queueing): a producer's next id gets virtual time
  max(g, its last) + 1; the lowest virtual time is taken first (equal times: in member order,
  as the sorted set sorts them). A producer that queued 100,000 ids holds 1, 2, ..., 100,000; a
  request from another producer arriving when g = 500 gets 501, so it waits behind at most one
  id per producer with work.
- FIFO for one producer at one level: its virtual times strictly increase.
- Why one list per producer is enough: while a producer has ids queued at a level, their
  virtual times are consecutive (a push continues from its last, and its last >= g while it has
  anything queued: ids are taken lowest time first). So its lane holds them in order and the
  lanes set keeps only the first one's time: the id at index i has time score + i. A take pops
  the lowest-scored lane, sets g to its score, and scores the lane one higher (or drops it when
  empty). A producer with no queued id at the level is not in the set: its next push gets
  g + 1 (max(g, last) = g, its last being behind g), so no producer is remembered beyond its
  queued ids, and a level's clock never grows with the producers it served.
- Front lane: an id given back (a redelivery, a hand-off taken back) waited its turn once; it
  joins the front lane, taken before every producer of its level, in the order given back; g
  does not move.
- Removal (withdraw, cancel) is lazy and O(1): the id stays in its lane and joins the removed
  set; the depth goes down at once. A take that pops an id of that set drops it from the set
  and skips it, without counting it again; the set is looked at only while x > 0.
- Depth: n is exact (pushes minus takes minus removals); a record that expired while queued
  counts until a take pops it (take.lua skips it then).
- A level whose depth reaches 0 leaves LEVELS (so take parks, and reads see it empty). Its keys
  are deleted then, with the lanes that hold only removed ids when there are at most
  FORGET_MAX of them (never more work than that in one call); else they stay, skipped by the
  takes once a push brings the level back, or until their TTL.
- Bounded work: a take step costs the same whatever the depth and the number of producers; one
  pop skips at most POP_STEPS removed ids (then it returns nil: the take hands out nothing this
  time, and does not park while LEVELS says work is queued).
- TTL: a push refreshes every key of its level (t remembers the TTL, r when: server ms) when the
  level was empty, when its TTL changes, or once 1/REFRESH_SHARE of it has passed since the last
  refresh; in between it lists nothing new but a lane, which gets its TTL when created (and
  joins the lanes set: a lane that held ids already is in it). So the keys of a level live at
  least (1 - 1/REFRESH_SHARE) of the TTL after its last push, and a busy level costs a push 3
  commands, not 9. A take refreshes the lane it popped.
]]
local SHARE = 10
local POP_STEPS = 256
local FORGET_MAX = 128
local PUSH_BATCH = 1000
local DEFAULT_TTL = 86400000
local REFRESH_SHARE = 8

-- a limit is a positive integer; anything else written into the limits hash is no limit
local function limit(value)
  local n = tonumber(value)
  if n and n >= 1 and n == math.floor(n) then return n end
  return nil
end

local function server_ms()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- after a push to `lane` of level p: the level is listed, its keys live for ttl more ms
local function touch_level(levels, level, p, lane, ttl, x)
  redis.call('ZADD', levels, p, p)
  redis.call('PEXPIRE', levels, ttl)
  redis.call('PEXPIRE', level, ttl)
  redis.call('PEXPIRE', level .. ':o', ttl)
  redis.call('PEXPIRE', lane, ttl)
  if (tonumber(x) or 0) > 0 then redis.call('PEXPIRE', level .. ':x', ttl) end
end

-- queue ids (in this order) at level p for one producer; ttl (ms) for the level's keys; now:
-- the server's clock (ms)
local function queue_push(levels, prefix, p, producer, ids, ttl, now)
  if #ids == 0 then return end
  local level = prefix .. p
  local member = 'p' .. producer
  local lane = level .. ':' .. member
  local g, n, x, t, r = unpack(redis.call('HMGET', level, 'g', 'n', 'x', 't', 'r'))
  n, r = tonumber(n) or 0, tonumber(r)
  local length = 0
  for i = 1, #ids, PUSH_BATCH do
    length = redis.call('RPUSH', lane, unpack(ids, i, math.min(i + PUSH_BATCH - 1, #ids)))
  end
  local refresh = n <= 0 or t ~= tostring(ttl) or not r
    or now - r >= tonumber(ttl) / REFRESH_SHARE
  -- a lane that held ids already is listed (a lane leaves the lanes set only once empty), so
  -- only a new lane is added, and any lane at a refresh (should the set have lost it)
  if length == #ids or refresh then
    redis.call('ZADD', level .. ':o', 'NX', (tonumber(g) or 0) + 1, member)
  end
  if refresh then
    redis.call('HSET', level, 'n', n + #ids, 't', ttl, 'r', now)
    touch_level(levels, level, p, lane, ttl, x)
  else  -- listed, and refreshed lately: only a new lane needs its TTL
    redis.call('HSET', level, 'n', n + #ids)
    if length == #ids then redis.call('PEXPIRE', lane, ttl) end
  end
end

-- queue an id at the front of level p (a redelivery: it waited its turn once already)
local function queue_push_front(levels, prefix, p, id, ttl)
  local level = prefix .. p
  local lane = level .. ':f'
  local n, x = unpack(redis.call('HMGET', level, 'n', 'x'))
  redis.call('RPUSH', lane, id)
  redis.call('ZADD', level .. ':o', '-inf', 'f')
  redis.call('HSET', level, 'n', (tonumber(n) or 0) + 1, 't', ttl)
  touch_level(levels, level, p, lane, ttl, x)
end

-- level p's depth reached 0: it leaves LEVELS; its keys go when that is at most FORGET_MAX
-- deletions (x: the removed ids its lanes still hold, so at most x lanes remain)
local function forget_level(levels, prefix, p, x)
  redis.call('ZREM', levels, p)
  if (tonumber(x) or 0) > FORGET_MAX then return end
  local level = prefix .. p
  local gone = {level, level .. ':o', level .. ':x'}
  for _, member in ipairs(redis.call('ZRANGE', level .. ':o', 0, FORGET_MAX)) do
    gone[#gone + 1] = level .. ':' .. member
  end
  redis.call('DEL', unpack(gone))
end

-- take one id out of level p (withdraw, cancel), lazily; nothing when p holds nothing. The
-- caller knows the id is queued there (its record says so).
local function queue_remove(levels, prefix, p, id)
  local level = prefix .. p
  local n, x, t = unpack(redis.call('HMGET', level, 'n', 'x', 't'))
  n = tonumber(n) or 0
  if n <= 0 or redis.call('SADD', level .. ':x', id) == 0 then return end
  x = (tonumber(x) or 0) + 1
  redis.call('HSET', level, 'n', n - 1, 'x', x)
  redis.call('PEXPIRE', level .. ':x', t or DEFAULT_TTL)
  if n <= 1 then forget_level(levels, prefix, p, x) end
end

-- one step at level p: the id taken; false when the step only dropped a removed id (or met a
-- lane that had expired); nil when the level has no lane left (it is forgotten)
local function pop_at(levels, prefix, p)
  local level = prefix .. p
  local lanes = level .. ':o'
  local head = redis.call('ZRANGE', lanes, 0, 0, 'WITHSCORES')
  local member = head[1]
  if not member then
    forget_level(levels, prefix, p, 0)
    return nil
  end
  local n, x, t = unpack(redis.call('HMGET', level, 'n', 'x', 't'))
  n, x = tonumber(n) or 0, tonumber(x) or 0
  local lane = level .. ':' .. member
  local id = redis.call('LPOP', lane)
  local more = id and redis.call('PEXPIRE', lane, t or DEFAULT_TTL) == 1
  local g = nil
  if member ~= 'f' then
    g = tonumber(head[2])
    if more then redis.call('ZADD', lanes, g + 1, member) else redis.call('ZREM', lanes, member) end
  elseif not more then
    redis.call('ZREM', lanes, member)
  end
  if not id then return false end
  if x > 0 and redis.call('SREM', level .. ':x', id) == 1 then
    if g then redis.call('HSET', level, 'g', g, 'x', x - 1)
    else redis.call('HSET', level, 'x', x - 1) end
    return false
  end
  if g then redis.call('HSET', level, 'g', g, 'n', n - 1)
  else redis.call('HSET', level, 'n', n - 1) end
  if n <= 1 then forget_level(levels, prefix, p, x) end
  return id
end

-- the next id to hand out, by the rules above, removed from its level; nil when none is queued
-- (or when POP_STEPS steps only met removed ids)
local function queue_pop(levels, prefix)
  local steps = 0
  while steps < POP_STEPS do
    local top = redis.call('ZREVRANGE', levels, 0, 1)
    local p = top[1]
    if not p then return nil end
    if top[2] then  -- a lower level waits: every SHARE-th take goes to one of them, in turn
      local s = redis.call('HINCRBY', prefix .. p, 's', 1)
      if s % SHARE == 0 then
        local lower = redis.call('ZCARD', levels) - 1
        local k = 1 + (s / SHARE - 1) % lower
        p = redis.call('ZREVRANGE', levels, k, k)[1] or p
      end
    end
    local id
    repeat
      steps = steps + 1
      id = pop_at(levels, prefix, p)
    until id ~= false or steps >= POP_STEPS
    if id then return id end
  end
  return nil
end

-- up to `want` ids from the head lane of level p at once, in the order one-by-one pops would
-- give them: a producer's lane stays first while its next id's virtual time is below the next
-- lane's score (the front lane: all of it); false when the level needs the one-by-one path
-- (removed ids to skip, no lane listed, a lane gone)
local function pop_run(levels, prefix, p, want)
  local level = prefix .. p
  local lanes = level .. ':o'
  local n, x, t = unpack(redis.call('HMGET', level, 'n', 'x', 't'))
  n, x = tonumber(n) or 0, tonumber(x) or 0
  if x > 0 then return false end
  local head = redis.call('ZRANGE', lanes, 0, 1, 'WITHSCORES')
  local member = head[1]
  if not member then return false end
  local score = tonumber(head[2])
  local k = want
  if member ~= 'f' and head[3] then
    k = math.min(want, math.max(1, tonumber(head[4]) - score))
  end
  local lane = level .. ':' .. member
  local ids = redis.call('LPOP', lane, k)
  if not ids then return false end
  local m = #ids
  if n - m <= 0 then
    -- the level is empty now: it is forgotten at once (its lanes, this one still listed among
    -- them, go with it), without first writing what it is about to lose
    forget_level(levels, prefix, p, 0)
    return ids
  end
  local more = redis.call('PEXPIRE', lane, t or DEFAULT_TTL) == 1
  if member ~= 'f' then
    if more then redis.call('ZADD', lanes, score + m, member) else redis.call('ZREM', lanes, member) end
    redis.call('HSET', level, 'g', score + m - 1, 'n', n - m)
  else
    if not more then redis.call('ZREM', lanes, member) end
    redis.call('HSET', level, 'n', n - m)
  end
  return ids
end

-- the next ids to hand out (at most `want`), by the rules above, removed from their level; nil
-- when none is queued (or when POP_STEPS steps only met removed ids). While one level alone holds
-- work and it has no removed ids, a run of one lane comes out in one step (pop_run); else one id.
local function queue_pop_many(levels, prefix, want)
  if want > 1 then
    local top = redis.call('ZREVRANGE', levels, 0, 1)
    if not top[1] then return nil end
    if not top[2] then
      local ids = pop_run(levels, prefix, top[1], want)
      if ids then return ids end
    end
  end
  local id = queue_pop(levels, prefix)
  if id then return {id} end
  return nil
end

-- how many ids are queued, over all levels
local function queue_depth(levels, prefix)
  local n = 0
  for _, p in ipairs(redis.call('ZRANGE', levels, 0, -1)) do
    n = n + (tonumber(redis.call('HGET', prefix .. p, 'n')) or 0)
  end
  return n
end
