--[[ beat: one heartbeat of a request's sender or receiver; also tells the beater where the
request stands, and judges the other side.

KEYS[1]  request hash          prq:{e}:r:<id>
KEYS[2]  in-flight ids         prq:{e}:run      (zset: id -> last contact, server ms)
KEYS[3]  leased ids            prq:{e}:alo      (at_least_once ids in flight; same scores)
ARGV[1]  role: "s" (sender) or "r" (receiver)
ARGV[2]  owner token (receiver role; the sender passes "")
ARGV[3]  1: record a beat now; 0: only look (a receiver polling for cancellation)
ARGV[4]  sender timeout, ms (receiver role: a sender silent this long cancels the request)
ARGV[5]  TTL of an in-flight request, ms (a beat extends it)
ARGV[6]  node channel prefix   prq:node:
ARGV[7]  request id
ARGV[8]  TTL of the in-flight set, ms (a receiver's beat keeps it alive under a long call)
ARGV[9]  receiver role: how far its DataStreams were read, "<bytes read>/<bytes in all>"
         ("" when it has none); kept in the request for the sender's beats

Reply: {state, reason, progress}; progress (sender role) is the receiver's last reported
"<bytes read>/<bytes in all>", or ""
  state = "taken"       still in flight (for the receiver: and still its own)
          "fenced"      receiver role: another owner holds it now; stop working on it
          "queued", "done", "withdrawn", "cancelled"   as stored ("queued" also while a
                        hand-off waits for its receiver's confirmation) (reason for cancelled ones:
                        "cancelled", "sender_lost", "receiver_lost", "call_timeout", ...)
          "missing"     nothing is stored under the id (expired or lost with Redis data)

Invariants:
- beats and judgments use server time (TIME), the clock every node shares
- only the owner's beat counts for the receiver side: a fenced (zombie) receiver changes nothing
- a beat extends the in-flight TTL, so a long call keeps its keys while both sides live
- the sender side is judged by its last beat "hs", or before its first beat by "tk"; a detached
  request (no "snd") has no sender to judge
]]
-- include: _body
local st, why, own, hs, tk, snd, pg = unpack(record_hmget(KEYS[1], {'st', 'why', 'own',
  'hs', 'tk', 'snd', 'pg'}))
if not st then return {'missing', '', ''} end
if st == 'handed' then return {'queued', '', ''} end  -- not picked up yet (_handoff.lua)
if st ~= 'taken' then return {st, why or '', ''} end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

if ARGV[1] == 's' then
  if ARGV[3] == '1' then
    redis.call('HSET', KEYS[1], 'hs', now)
    redis.call('PEXPIRE', KEYS[1], ARGV[5])
  end
  return {'taken', '', pg or ''}
end

if own ~= ARGV[2] then return {'fenced', '', ''} end
local last = math.max(tonumber(hs) or 0, tonumber(tk) or 0)
-- a detached request (bulk enqueue) names no sender: nobody's silence can cancel it
if snd and now - last > tonumber(ARGV[4]) then
  redis.call('HSET', KEYS[1], 'st', 'cancelled', 'why', 'sender_lost', 'dn', now)
  drop_body(KEYS[1], {})
  redis.call('ZREM', KEYS[2], ARGV[7])
  if snd then
    redis.call('PUBLISH', ARGV[6] .. snd, 'r|' .. ARGV[7] .. '|')
  end
  return {'cancelled', 'sender_lost', ''}
end
if ARGV[3] == '1' then
  redis.call('HSET', KEYS[1], 'hr', now)
  if ARGV[9] ~= '' then redis.call('HSET', KEYS[1], 'pg', ARGV[9]) end
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  redis.call('ZADD', KEYS[2], 'XX', now, ARGV[7])
  redis.call('PEXPIRE', KEYS[2], ARGV[8])
  redis.call('ZADD', KEYS[3], 'XX', now, ARGV[7])
end
return {'taken', '', ''}
