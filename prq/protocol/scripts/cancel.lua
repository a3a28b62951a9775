--[[ cancel: stop a request from any node: withdraw it before pickup, or cancel it after.

KEYS[1]  request hash          prq:{e}:r:<id>
KEYS[2]  in-flight ids         prq:{e}:run      (a cancelled taken id leaves it)
KEYS[3]  queued levels         prq:{e}:pri      (a withdrawn queued id leaves its level)
KEYS[4]  level prefix          prq:{e}:l:       (_queue.lua)
KEYS[5]  leased ids            prq:{e}:alo      (a cancelled at_least_once id leaves it)
KEYS[6]  hand-offs             prq:{e}:ho       (a withdrawn hand-off leaves it; _handoff.lua)
ARGV[1]  reason                "cancelled", "call_timeout", ...
ARGV[2]  TTL of the cancelled request's record (the polled cancel marker), ms
ARGV[3]  node channel prefix   prq:node:
ARGV[4]  request id
ARGV[5]  nonce of this cancel call (the same when the call is retried)

Reply: {state, response, reason, mine}
  state = "withdrawn"   it was queued, or handed to a receiver that had not confirmed it, and
                        was never handed out before: it will never run (CancelledBeforePickup)
          "cancelled"   it was taken, or it is an at_least_once request queued again after a
                        receiver that took it went silent (it may have run there): its last
                        receiver is told (pub/sub "c|<id>|<reason>", and the state it polls),
                        and a response that comes later is dropped
          "done"        too late: it has its response (returned)
          "missing"     nothing is stored under the id
  mine  = 1 when this call (this nonce) made the change, also on a replay; else 0

Invariants:
- a cancel and a response race through one atomic step each: exactly one of them wins
- the sender and the watchers are pulsed so that their waits end at once
]]
-- include: _body
-- include: _queue
local st, rsp, why, wn, rcv, snd, watchers, pri, ma, att = unpack(record_hmget(KEYS[1], {'st',
  'rsp', 'why', 'wn', 'rcv', 'snd', 'w', 'pri', 'ma', 'att'}))
if not st then return {'missing', '', '', 0} end
if st == 'queued' or st == 'handed' or st == 'taken' then
  -- handed out before (att counts confirmed pickups): it may have run, so it is cancelled after
  -- pickup, whatever lane or hand-off it waits in now
  local after = st == 'taken' or (tonumber(att) or 0) > 0
  local was = st
  st = after and 'cancelled' or 'withdrawn'
  local now = server_ms()
  redis.call('HSET', KEYS[1], 'st', st, 'why', ARGV[1], 'dn', now, 'wn', ARGV[5])
  drop_body(KEYS[1], {})
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if was == 'taken' then
    redis.call('ZREM', KEYS[2], ARGV[4])
    if ma then redis.call('ZREM', KEYS[5], ARGV[4]) end
  elseif was == 'handed' then
    redis.call('HDEL', KEYS[1], 'own', 'ho')
    redis.call('ZREM', KEYS[2], ARGV[4])
    redis.call('ZREM', KEYS[6], ARGV[4])
  else
    queue_remove(KEYS[3], KEYS[4], pri or '0', ARGV[4])
  end
  if after and rcv then
    redis.call('PUBLISH', ARGV[3] .. rcv, 'c|' .. ARGV[4] .. '|' .. ARGV[1])
  end
  local msg = 'r|' .. ARGV[4] .. '|'
  if snd then redis.call('PUBLISH', ARGV[3] .. snd, msg) end
  if watchers then
    for node in string.gmatch(watchers, '%S+') do redis.call('PUBLISH', ARGV[3] .. node, msg) end
  end
  return {st, '', ARGV[1], 1}
end
local mine = 0
if (st == 'withdrawn' or st == 'cancelled') and wn == ARGV[5] then mine = 1 end
return {st, rsp or '', why or '', mine}
