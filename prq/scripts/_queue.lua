--[[ _queue: the scheduling helpers shared by the scripts that queue, take or remove requests.
Scripts include this file where they say `-- include: _queue`; it is not a script of its own.

Layout, for one endpoint (the caller passes LEVELS and PREFIX as KEYS):
  LEVELS          zset    priorities that hold queued ids (member = score = the priority)
  PREFIX .. p     zset    level p: queued ids, scored by virtual start time
  PREFIX .. p .. ':vt'    level p's clock (hash): g = the virtual time of the last id taken,
                  p<producer> = the last virtual time given to that producer, s = the takes this
                  level made while a lower level waited, c = the producer sweep's cursor

The rules:
- Priority: a take serves the highest level; but while lower levels hold work, every SHARE-th
  take goes to one of them instead, in turn from the next level down (counted by the highest
  level's 's'). The highest level gets SHARE - 1 of every SHARE takes, and each of n lower
  levels with work at least one in SHARE * n: slowed, never starved.
- Fairness within a level (start-time fair queueing): a producer's next id gets virtual time
  max(g, its last) + 1; the lowest virtual time is taken first. A producer that queued 100,000
  ids holds 1, 2, ..., 100,000; a request from another producer arriving when g = 500 gets 501,
  so it waits behind at most one id per producer with work.
- FIFO for one producer at one level: its virtual times strictly increase.
- A level that empties is forgotten (its set, its clock and its entry in LEVELS).
- A producer whose last virtual time is behind g has nothing queued (ids are taken lowest
  virtual time first, and none is given a time below g): its field says no more than its
  absence would (max(g, last) = g), so a level whose clock holds
  more than SWEEP_ABOVE fields forgets such producers, SWEEP_COUNT fields a take (HSCAN from a
  cursor kept in the clock as 'c'). g never goes back (the lowest virtual time is taken first,
  and an id queued at the front gets g itself), so forgetting them changes no order. Without
  this, a level that never empties would keep a field for every producer it ever served (one per
  node restart, with the default producer).
]]
local SHARE = 10
local SWEEP_ABOVE = 64
local SWEEP_COUNT = 16

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

-- queue ids (in this order) at level p for one producer; ttl (ms) for the level's keys
local function queue_push(levels, prefix, p, producer, ids, ttl)
  local q, clock = prefix .. p, prefix .. p .. ':vt'
  local g, last = unpack(redis.call('HMGET', clock, 'g', 'p' .. producer))
  local t = math.max(tonumber(g) or 0, tonumber(last) or 0)
  local args = {}
  for i = 1, #ids do
    args[#args + 1] = t + i
    args[#args + 1] = ids[i]
    if #args >= 4000 then
      redis.call('ZADD', q, unpack(args))
      args = {}
    end
  end
  if #args > 0 then redis.call('ZADD', q, unpack(args)) end
  redis.call('HSET', clock, 'p' .. producer, t + #ids)
  redis.call('ZADD', levels, p, p)
  redis.call('PEXPIRE', q, ttl)
  redis.call('PEXPIRE', clock, ttl)
  redis.call('PEXPIRE', levels, ttl)
end

-- queue an id at the front of level p (a redelivery: it waited its turn once already)
local function queue_push_front(levels, prefix, p, id, ttl)
  local q, clock = prefix .. p, prefix .. p .. ':vt'
  local g = tonumber(redis.call('HGET', clock, 'g')) or 0
  redis.call('ZADD', q, g, id)
  redis.call('HSET', clock, 'g', g)  -- a level's clock exists (with its TTL) while it does
  redis.call('ZADD', levels, p, p)
  redis.call('PEXPIRE', q, ttl)
  redis.call('PEXPIRE', clock, ttl)
  redis.call('PEXPIRE', levels, ttl)
end

local function forget_level(levels, prefix, p)
  redis.call('DEL', prefix .. p, prefix .. p .. ':vt')
  redis.call('ZREM', levels, p)
end

-- take one id out of level p (withdraw, cancel); nothing when it is not there
local function queue_remove(levels, prefix, p, id)
  local q = prefix .. p
  if redis.call('ZREM', q, id) == 1 and redis.call('EXISTS', q) == 0 then
    forget_level(levels, prefix, p)
  end
end

-- forget up to SWEEP_COUNT producers of a level's clock whose last virtual time is behind g
local function sweep_producers(clock, g)
  local cursor = redis.call('HGET', clock, 'c') or '0'
  local scan = redis.call('HSCAN', clock, cursor, 'COUNT', SWEEP_COUNT)
  local fields = scan[2]
  for i = 1, #fields, 2 do
    if string.sub(fields[i], 1, 1) == 'p' and (tonumber(fields[i + 1]) or 0) < g then
      redis.call('HDEL', clock, fields[i])
    end
  end
  redis.call('HSET', clock, 'c', scan[1])
end

-- the next id to hand out, by the rules above, removed from its level; nil when none is queued
local function queue_pop(levels, prefix)
  for _ = 1, 100000 do
    local top = redis.call('ZREVRANGE', levels, 0, 1)
    local p = top[1]
    if not p then return nil end
    if top[2] then  -- a lower level waits: every SHARE-th take goes to one of them, in turn
      local s = redis.call('HINCRBY', prefix .. p .. ':vt', 's', 1)
      if s % SHARE == 0 then
        local lower = redis.call('ZCARD', levels) - 1
        local k = 1 + (s / SHARE - 1) % lower
        p = redis.call('ZREVRANGE', levels, k, k)[1] or p
      end
    end
    local q, clock = prefix .. p, prefix .. p .. ':vt'
    local got = redis.call('ZPOPMIN', q)
    if got[1] and redis.call('EXISTS', q) == 1 then
      redis.call('HSET', clock, 'g', got[2])
      if redis.call('HLEN', clock) > SWEEP_ABOVE then sweep_producers(clock, tonumber(got[2])) end
      return got[1]
    end
    forget_level(levels, prefix, p)  -- emptied now, or found empty (expired)
    if got[1] then return got[1] end
  end
  return nil
end

-- how many ids are queued, over all levels
local function queue_depth(levels, prefix)
  local n = 0
  for _, p in ipairs(redis.call('ZRANGE', levels, 0, -1)) do
    n = n + redis.call('ZCARD', prefix .. p)
  end
  return n
end
