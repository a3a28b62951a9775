--[[ withdraw: the sender takes back a request that no receiver has picked up yet.

KEYS[1]  request hash          prq:{e}:r:<id>
KEYS[2]  queued levels         prq:{e}:pri (the withdrawn id leaves its level; _queue.lua)
KEYS[3]  level prefix          prq:{e}:l:
KEYS[4]  in-flight ids         prq:{e}:run      (a withdrawn hand-off leaves it)
KEYS[5]  hand-offs             prq:{e}:ho       (_handoff.lua)
ARGV[1]  reason                "pickup_timeout", "cancelled", "call_timeout", ...
ARGV[2]  TTL of the tombstone left behind, ms
ARGV[3]  now_ms
ARGV[4]  node channel prefix   prq:node:   (the sender and watchers are told, so they stop waiting)
ARGV[5]  request id
ARGV[6]  nonce of this withdraw call (the same when the call is retried)

Reply: {state, response, reason, mine}
  mine  = 1 when this call (this nonce) withdrew the request, also on a replay; else 0
  state = "withdrawn"   withdrawn (by this call, or earlier by another)
          "taken", "done", "cancelled"   too late: the request is in that state; response and
                        reason are filled in where the state has them
          "queued", "handed"   too late too: an at_least_once request queued again after a
                        receiver that took it went silent (it may have run) is withdrawn only
                        when its window passes (reason "redelivery_timeout")
          "missing"     nothing is stored under the id (expired or lost)

Invariants:
- a request handed to a parked receiver that has not confirmed it is not picked up: it is
  withdrawn like a queued one, and the receiver's confirmation then finds it gone
- a withdrawn request is never handed out: its id leaves its level, and take would skip it
  anyway; the levels' sizes are then the queue depth, but for ids of senders that died without
  withdrawing, which stay until a take skips them (past their pickup deadline)
- removing the id is O(1) wherever it sits in the queue (marked removed; _queue.lua)
- the tombstone keeps the reason (for other waiters and status) and has a TTL
]]
-- include: _body
-- include: _queue
local st, rsp, why, wn, pri, att = unpack(record_hmget(KEYS[1], {'st', 'rsp', 'why', 'wn',
  'pri', 'att'}))
if not st then return {'missing', '', '', 0} end
local before = (tonumber(att) or 0) > 0
local reason = ARGV[1]
local window = reason == 'pickup_timeout' or reason == 'redelivery_timeout'
if (st == 'queued' or st == 'handed') and window then
  -- its record says which, not the caller: handed out before (an at_least_once request whose
  -- receiver went silent, queued again) it may have run, and its window passing is a
  -- redelivery timeout; never (att 0: also one a take cut short gave back unrun, untake) it
  -- is "never picked up"
  reason = before and 'redelivery_timeout' or 'pickup_timeout'
elseif before and (st == 'queued' or st == 'handed') then
  -- any other withdrawal of one handed out before is too late (it may have run), as for a
  -- taken request
  return {st, '', why or '', 0}
end
if st == 'queued' or st == 'handed' then
  redis.call('HSET', KEYS[1], 'st', 'withdrawn', 'why', reason, 'dn', ARGV[3], 'wn', ARGV[6])
  drop_body(KEYS[1], {'own', 'ho'})
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if st == 'queued' then
    queue_remove(KEYS[2], KEYS[3], pri or '0', ARGV[5])
  else
    redis.call('ZREM', KEYS[4], ARGV[5])
    redis.call('ZREM', KEYS[5], ARGV[5])
  end
  local snd, watchers = unpack(redis.call('HMGET', KEYS[1], 'snd', 'w'))
  local msg = 'r|' .. ARGV[5] .. '|'
  if snd then redis.call('PUBLISH', ARGV[4] .. snd, msg) end
  if watchers then
    for node in string.gmatch(watchers, '%S+') do redis.call('PUBLISH', ARGV[4] .. node, msg) end
  end
  return {'withdrawn', '', reason, 1}
end
local mine = 0
if st == 'withdrawn' and wn == ARGV[6] then mine = 1 end
return {st, rsp or '', why or '', mine}
