--[[ read_response: where a request stands, with its response once there is one; a receiver
that stopped beating is declared lost here.

KEYS[1]  request hash          prq:{e}:r:<id>
KEYS[2]  in-flight ids         prq:{e}:run      (a lost receiver's id leaves it)
ARGV[1]  receiver timeout, ms: a taken request whose receiver has not beaten (nor taken it)
         for this long is cancelled with reason "receiver_lost" (0: judge nothing)
ARGV[2]  node channel prefix   prq:node:   (the lost receiver's node is told, in case it lives)
ARGV[3]  request id

Reply: {state, response, reason, pickup deadline (ms, "" when none)}; state "missing" when
nothing is stored under the id.

Invariants:
- liveness is judged by server time (TIME) against the receiver's last beat "hr" or, before its
  first beat, the moment it took the request "tk"; both are server time too
- declaring the receiver lost is one atomic step with the check, so a beat that lands first
  keeps the request alive, and a zombie receiver that wakes later finds it cancelled (fenced)
]]
local st, rsp, why, hr, tk, rcv, pd = unpack(redis.call('HMGET', KEYS[1], 'st', 'rsp', 'why',
  'hr', 'tk', 'rcv', 'pd'))
if not st then return {'missing', '', '', ''} end
local timeout = tonumber(ARGV[1])
if st == 'taken' and timeout > 0 then
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  local last = math.max(tonumber(hr) or 0, tonumber(tk) or 0)
  if now - last > timeout then
    redis.call('HSET', KEYS[1], 'st', 'cancelled', 'why', 'receiver_lost', 'dn', now)
    redis.call('HDEL', KEYS[1], 'b')
    redis.call('ZREM', KEYS[2], ARGV[3])
    if rcv then
      redis.call('PUBLISH', ARGV[2] .. rcv, 'c|' .. ARGV[3] .. '|receiver_lost')
    end
    return {'cancelled', '', 'receiver_lost', pd or ''}
  end
end
return {st, rsp or '', why or '', pd or ''}
