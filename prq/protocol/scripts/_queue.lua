--[[ _queue: the scheduling helpers shared by the scripts that queue, take or remove requests.
Scripts include this file where they say `-- include: _queue`; it is not a script of its own.

Layout, for one endpoint (the caller passes LEVELS and PREFIX as KEYS; prq/core/keys.py spells them):
  LEVELS                 zset   priorities whose depth is above 0 (member = score = the priority)
  LEVELS .. SHARES       hash   the share of takes the lower levels get: s = the takes made since
                                the last lower turn while a lower level held work, c = the level
                                that turn went to (its TTL: the queue's, given by take.lua)
  PREFIX .. p            hash   level p's clock: g = the virtual time of the last id taken from a
                                producer's lane, n = its depth (ids queued, not taken, not
                                removed), x = how many ids its removed set holds, t = its keys'
                                TTL (ms), r = when they were last given it (server ms)
  PREFIX .. p .. ':o'    zset   level p's lanes: 'p' .. producer, scored by the virtual time of
                                that producer's first queued id; 'f' (the front lane) at -inf
  PREFIX .. p .. ':' .. lane   list   that lane's ids, in take order (one entry per id)
  PREFIX .. p .. ':x'    set    ids removed (withdraw, cancel) that are still in a lane

The rules:
- Priority: a take serves the highest level; but while a lower level holds work, every SHARE-th
  take goes to one of them instead. The count is the endpoint's (LEVELS .. SHARES), not a
  level's, so it lives on while the lower levels wait, however often the highest one runs empty
  and fills again: a higher level whose requests are taken as fast as they come (one waiting at
  every take) still sends every SHARE-th take down.
- Lower turns go round the lower levels by priority, not by rank in LEVELS (which shifts as
  levels come and go): each goes to the next level with work below the one the last went to
  (c), and after the lowest to the highest lower level again. So the highest level gets
  SHARE - 1 of every SHARE takes made while a lower level holds work, and each of n lower levels
  with work at least one in SHARE * n: slowed, never starved. A lower turn that finds its level
  gone (listed, no lane left) passes to the next lower level.
- What counts: each pop made while two or more levels hold work, whatever lane it pops (an id
  handed out, or one dropped because its request was gone or past its deadline; an id skipped
  as removed does not count, the same pop goes on at the same level). A take while one level
  alone holds work counts nothing, so no level banks turns while the others are empty. A
  give-back (a redelivery, a hand-off taken back, a receiver's hand-back) does not undo the pop
  it follows: the id joins its level's front lane and waits for that level's next turn. The
  count starts over (its hash is deleted) when the levels below the highest all run empty, or
  nothing is queued; not when the highest runs empty while a lower one waits.
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
  counts until a take pops it (take.lua skips it then). A removal is only for an id still in a
  lane: its record says "queued" (take.lua writes one it pops and skips "withdrawn" in the same
  step), so no id is counted out twice, by its pop and by its removal.
- A level whose depth reaches 0 leaves LEVELS (so take parks, and reads see it empty). Its keys
  are deleted then, with the lanes that hold only removed ids when there are at most
  FORGET_MAX of them (never more work than that in one call); else they stay, skipped by the
  takes once a push brings the level back, or until their TTL.
- Bounded work: a take step costs the same whatever the depth and the number of producers (and
  grows with the log of the number of levels: LEVELS is a sorted set); one pop skips at most
  POP_STEPS removed ids (then it returns nil: the take hands out nothing this time, and does not
  park while LEVELS says work is queued). The share count costs a pop made while lower levels
  wait one command (two when it is new), four more at a lower turn, and a removal that empties
  a level one (to see the levels left); a pop while one level alone holds work, none.
- TTL: a push refreshes every key of its level (t remembers the TTL, r when: server ms) when the
  level was empty, once 1/REFRESH_SHARE of its TTL has passed since the last refresh, or when
  the ids pushed would outlive the keys (a pickup window longer than the queue's TTL); in
  between it lists nothing new but a lane, which gets the level's expiry when created (and joins
  the lanes set: a lane that held ids already is in it). So every lane lives at least as long as
  its level's keys (a refresh gives them all the same TTL, a take gives the lane it popped the
  level's TTL from then), and ids pushed without a refresh, which by then outlive none of the
  level's keys, outlive no lane either (before 2026-12-07 a lane created between refreshes got
  the queue's TTL or its first ids' only, so ids with a longer window pushed to it later
  outlived it, and were lost from the queue with it). A refresh gives the queue's TTL, or more when the
  ids' records live longer (and never less than the keys have left), so a level's keys outlive
  every id queued in it whatever its pickup window, and live at least (1 - 1/REFRESH_SHARE) of
  the queue's TTL after its last push; a busy level costs a push 3 commands, not 10. A take
  refreshes the lane it popped (to at least the level's expiry: now + t >= r + t).
]]
local SHARE = 10
local POP_STEPS = 256
local FORGET_MAX = 128
local PUSH_BATCH = 1000
local DEFAULT_TTL = 86400000
local REFRESH_SHARE = 8
local SHARES = ':s'

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

-- the TTL (ms) a refresh at `now` gives a level's keys: the queue's (ttl), or longer when the
-- ids pushed must live longer (hold: their records' TTL, with room for the pushes made until the
-- next refresh), and never shorter than what the keys have left (t, r: the last refresh)
local function level_ttl(ttl, hold, t, r, now)
  hold = tonumber(hold) or 0
  local keep = math.max(tonumber(ttl), hold + math.floor(hold / REFRESH_SHARE))
  if tonumber(t) and tonumber(r) then keep = math.max(keep, tonumber(r) + tonumber(t) - now) end
  return keep
end

-- after a push to `lane` of level p: the level is listed, its keys live for ttl more ms; the
-- levels set, shared by every level, only ever gains time (another level may need more)
local function touch_level(levels, level, p, lane, ttl, x)
  redis.call('ZADD', levels, p, p)
  if redis.call('PTTL', levels) < tonumber(ttl) then redis.call('PEXPIRE', levels, ttl) end
  redis.call('PEXPIRE', level, ttl)
  redis.call('PEXPIRE', level .. ':o', ttl)
  redis.call('PEXPIRE', lane, ttl)
  if (tonumber(x) or 0) > 0 then redis.call('PEXPIRE', level .. ':x', ttl) end
end

-- queue ids (in this order) at level p for one producer; ttl (ms) for the level's keys; now:
-- the server's clock (ms); hold (ms): how long the ids' records live (nil: no longer than ttl)
local function queue_push(levels, prefix, p, producer, ids, ttl, now, hold)
  if #ids == 0 then return end
  local level = prefix .. p
  local member = 'p' .. producer
  local lane = level .. ':' .. member
  local g, n, x, t, r = unpack(redis.call('HMGET', level, 'g', 'n', 'x', 't', 'r'))
  n, r, t, hold = tonumber(n) or 0, tonumber(r), tonumber(t), tonumber(hold) or 0
  local length = 0
  for i = 1, #ids, PUSH_BATCH do
    length = redis.call('RPUSH', lane, unpack(ids, i, math.min(i + PUSH_BATCH - 1, #ids)))
  end
  local refresh = n <= 0 or not r or not t or now - r >= t / REFRESH_SHARE
    or now + hold > r + t
  -- a lane that held ids already is listed (a lane leaves the lanes set only once empty), so
  -- only a new lane is added, and any lane at a refresh (should the set have lost it)
  if length == #ids or refresh then
    redis.call('ZADD', level .. ':o', 'NX', (tonumber(g) or 0) + 1, member)
  end
  if refresh then
    local keep = level_ttl(ttl, hold, n > 0 and t, r, now)
    redis.call('HSET', level, 'n', n + #ids, 't', keep, 'r', now)
    touch_level(levels, level, p, lane, keep, x)
  else  -- listed, and refreshed lately: only a new lane needs its TTL, the level's (r + t)
    redis.call('HSET', level, 'n', n + #ids)
    if length == #ids then redis.call('PEXPIRE', lane, math.max(r + t - now, hold)) end
  end
end

-- queue an id at the front of level p (a redelivery: it waited its turn once already); ttl, now
-- and hold as for queue_push
local function queue_push_front(levels, prefix, p, id, ttl, now, hold)
  local level = prefix .. p
  local lane = level .. ':f'
  local n, x, t, r = unpack(redis.call('HMGET', level, 'n', 'x', 't', 'r'))
  n = tonumber(n) or 0
  local keep = level_ttl(ttl, hold, n > 0 and t, r, now)
  redis.call('RPUSH', lane, id)
  redis.call('ZADD', level .. ':o', '-inf', 'f')
  redis.call('HSET', level, 'n', n + 1, 't', keep, 'r', now)
  touch_level(levels, level, p, lane, keep, x)
end

-- level p's depth reached 0: it leaves LEVELS; its keys go when that is at most FORGET_MAX
-- deletions (x: the removed ids its lanes still hold, so at most x lanes remain). reset: the
-- share count goes too (p was the last level below the highest, or the only one); nil when the
-- caller does not know: then the levels left tell (one ZREVRANGE)
local function forget_level(levels, prefix, p, x, reset)
  redis.call('ZREM', levels, p)
  if reset == nil then
    local left = redis.call('ZREVRANGE', levels, 0, 1)
    reset = not left[2] and not (left[1] and tonumber(left[1]) < tonumber(p))
  end
  local gone = {}
  if reset then gone[1] = levels .. SHARES end
  if (tonumber(x) or 0) <= FORGET_MAX then
    local level = prefix .. p
    gone[#gone + 1] = level
    gone[#gone + 1] = level .. ':o'
    gone[#gone + 1] = level .. ':x'
    for _, member in ipairs(redis.call('ZRANGE', level .. ':o', 0, FORGET_MAX)) do
      gone[#gone + 1] = level .. ':' .. member
    end
  end
  if #gone > 0 then redis.call('DEL', unpack(gone)) end
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
-- lane that had expired); nil when the level has no lane left (it is forgotten). reset: whether
-- the share count goes should p run empty (forget_level)
local function pop_at(levels, prefix, p, reset)
  local level = prefix .. p
  local lanes = level .. ':o'
  local head = redis.call('ZRANGE', lanes, 0, 0, 'WITHSCORES')
  local member = head[1]
  if not member then
    forget_level(levels, prefix, p, 0, reset)
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
  if n <= 1 then forget_level(levels, prefix, p, x, reset) end
  return id
end

-- a lower turn: the level it goes to, the next one with work below the level the last lower
-- turn went to (c), or below the highest (top) when c is not below it; after the lowest, the
-- highest lower level (below: the level just below top) again. The count starts over.
local function lower_turn(shares, levels, top, below, ttl)
  local c = redis.call('HGET', shares, 'c')
  local from = top
  if tonumber(c) and tonumber(c) < tonumber(top) then from = c end
  local p = redis.call('ZRANGE', levels, '(' .. from, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1)[1]
    or below
  redis.call('HSET', shares, 's', 0, 'c', p)
  redis.call('PEXPIRE', shares, ttl)
  return p
end

-- the next id to hand out, by the rules above, removed from its level; nil when none is queued
-- (or when POP_STEPS steps only met removed ids); ttl (ms) for the share count, should it be new
local function queue_pop(levels, prefix, ttl)
  local shares = levels .. SHARES
  ttl = ttl or DEFAULT_TTL
  local steps = 0
  local owed = false  -- a lower turn found its level gone (no lane left): the next is one too
  while steps < POP_STEPS do
    local top = redis.call('ZREVRANGE', levels, 0, 2)
    local p = top[1]
    if not p then return nil end
    local turn = false
    if top[2] then  -- a lower level waits: every SHARE-th take goes to one of them, in turn
      turn = owed
      if not turn then
        local s = redis.call('HINCRBY', shares, 's', 1)
        if s == 1 then redis.call('PEXPIRE', shares, ttl) end  -- (new, or started over)
        turn = s >= SHARE
      end
      if turn then p = lower_turn(shares, levels, p, top[2], ttl) end
    end
    -- the count starts over when this take empties the last level below the highest (or the
    -- only level), not when it empties the highest while a lower one waits
    local reset = not top[2] or (not top[3] and p ~= top[1])
    local id
    repeat
      steps = steps + 1
      id = pop_at(levels, prefix, p, reset)
    until id ~= false or steps >= POP_STEPS
    if id then return id end
    owed = turn and id == nil
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
    -- them, go with it), without first writing what it is about to lose; it was the only
    -- level, so nothing is queued any more and the share count (if any) goes too
    forget_level(levels, prefix, p, 0, true)
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
-- ttl (ms): the queue's TTL, for the share count
local function queue_pop_many(levels, prefix, want, ttl)
  if want > 1 then
    local top = redis.call('ZREVRANGE', levels, 0, 1)
    if not top[1] then return nil end
    if not top[2] then
      local ids = pop_run(levels, prefix, top[1], want)
      if ids then return ids end
    end
  end
  local id = queue_pop(levels, prefix, ttl)
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
