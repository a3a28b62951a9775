--[[ read_response: where a request stands, with its response once there is one; a receiver
that stopped beating is declared lost here.

KEYS[1]  request hash          prq:{e}:r:<id>
KEYS[2]  in-flight ids         prq:{e}:run      (a lost receiver's id leaves it)
KEYS[3]  leased ids            prq:{e}:alo      (at_least_once ids in flight)
KEYS[4]  queued levels         prq:{e}:lv       (an at_least_once request goes back there)
KEYS[5]  level prefix          prq:{e}:q:
KEYS[6]  dead-lettered ids     prq:{e}:dead     (KEYS[6..8]: the dead-letter keys, _dead.lua)
KEYS[7]  their details         prq:{e}:deadm
KEYS[8]  their stored bytes    prq:{e}:deadb
ARGV[1]  receiver timeout, ms: a taken request whose receiver has not beaten (nor taken it)
         for this long is cancelled with reason "receiver_lost" (0: judge nothing)
ARGV[2]  node channel prefix   prq:node:   (the lost receiver's node is told, in case it lives)
ARGV[3]  request id
ARGV[4]  request TTL beyond its pickup window, ms (for a request handed out again)
ARGV[5]  queue TTL, ms
ARGV[6]  TTL of a dead letter, ms
ARGV[7]  most dead letters kept
ARGV[8]  the endpoint's pulse channel

Reply: {state, response, reason, pickup deadline (ms, "" when none), redelivered}; state
"missing" when nothing is stored under the id; redelivered = 1 when this call handed the request
out again or dead-lettered it (at_least_once, _redeliver.lua), else 0.

Invariants:
- liveness is judged by server time (TIME) against the receiver's last beat "hr" or, before its
  first beat, the moment it took the request "tk"; both are server time too
- declaring the receiver lost is one atomic step with the check, so a beat that lands first
  keeps the request alive, and a zombie receiver that wakes later finds it cancelled (fenced)
- an at_least_once request is not cancelled but queued again, or dead-lettered when its
  attempts are used up (reason "attempts_exhausted")
]]
-- include: _queue
-- include: _dead
-- include: _redeliver
local st, rsp, why, hr, tk, rcv, pd, ma = unpack(redis.call('HMGET', KEYS[1], 'st', 'rsp',
  'why', 'hr', 'tk', 'rcv', 'pd', 'ma'))
if not st then return {'missing', '', '', '', 0} end
local timeout = tonumber(ARGV[1])
if st == 'taken' and timeout > 0 then
  local now = server_ms()
  local last = math.max(tonumber(hr) or 0, tonumber(tk) or 0)
  if now - last > timeout and ma then
    local k = {hash = KEYS[1], run = KEYS[2], lease = KEYS[3], levels = KEYS[4],
      prefix = KEYS[5], dead = {KEYS[6], KEYS[7], KEYS[8]}}
    local o = {extra_ttl = ARGV[4], list_ttl = ARGV[5], dead_ttl = ARGV[6], dead_cap = ARGV[7],
      pulse = ARGV[8], node_prefix = ARGV[2]}
    redeliver(k, ARGV[3], now, o)
    st, why, pd = unpack(redis.call('HMGET', KEYS[1], 'st', 'why', 'pd'))
    return {st, '', why or '', pd or '', 1}
  end
  if now - last > timeout then
    redis.call('HSET', KEYS[1], 'st', 'cancelled', 'why', 'receiver_lost', 'dn', now)
    redis.call('HDEL', KEYS[1], 'b')
    redis.call('ZREM', KEYS[2], ARGV[3])
    if rcv then
      redis.call('PUBLISH', ARGV[2] .. rcv, 'c|' .. ARGV[3] .. '|receiver_lost')
    end
    return {'cancelled', '', 'receiver_lost', pd or '', 0}
  end
end
return {st, rsp or '', why or '', pd or '', 0}
