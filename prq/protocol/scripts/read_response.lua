--[[ read_response: where requests of one endpoint stand, with their responses once there are
any; a receiver that stopped beating is declared lost here. One call reads one request or many
(a bulk caller's window of outcomes: prq.bulk.BulkClient.outcomes).

KEYS[1]  request hash prefix   prq:{e}:r:       (ids are appended; same hash tag, same slot)
KEYS[2]  in-flight ids         prq:{e}:run      (a lost receiver's id leaves it)
KEYS[3]  leased ids            prq:{e}:alo      (at_least_once ids in flight)
KEYS[4]  queued levels         prq:{e}:pri      (an at_least_once request goes back there)
KEYS[5]  level prefix          prq:{e}:l:
KEYS[6]  dead-lettered ids     prq:{e}:dead     (KEYS[6..8]: the dead-letter keys, _dead.lua)
KEYS[7]  their details         prq:{e}:deadm
KEYS[8]  their stored bytes    prq:{e}:deadb
KEYS[9]  parked tokens         prq:{e}:parked   (KEYS[9..12]: for a hand-off taken back,
KEYS[10] park details          prq:{e}:parks     _handoff.lua)
KEYS[11] take receipt prefix   prq:{e}:t:
KEYS[12] hand-offs             prq:{e}:ho
ARGV[1]  receiver timeout, ms: a taken request whose receiver has not beaten (nor taken it)
         for this long is cancelled with reason "receiver_lost" (0: judge nothing)
ARGV[2]  node channel prefix   prq:node:   (the lost receiver's node is told, in case it lives)
ARGV[3]  request TTL beyond its pickup window, ms (for a request handed out again)
ARGV[4]  queue TTL, ms
ARGV[5]  TTL of a dead letter, ms
ARGV[6]  most dead letters kept
ARGV[7]  the endpoint's pulse channel
ARGV[8]  how long a hand-off may wait for its receiver's confirmation, ms
ARGV[9]  TTL of a taken request, ms
ARGV[10] TTL of a take receipt, ms
ARGV[11..] the request ids

Reply: one {state, response, reason, pickup left, redelivered} per id, in order; state "missing"
when nothing is stored under the id, "handed" while a hand-off waits for its receiver's
confirmation (not picked up); pickup left = ms until the pickup deadline by server time
(negative once past, "" when the request has none); redelivered = 1 when this call handed the
request out again or dead-lettered it (at_least_once, _redeliver.lua), else 0.

Invariants:
- liveness is judged by server time (TIME) against the receiver's last beat "hr" or, before its
  first beat, the moment it took the request "tk"; both are server time too
- declaring the receiver lost is one atomic step with the check, so a beat that lands first
  keeps the request alive, and a zombie receiver that wakes later finds it cancelled (fenced)
- an at_least_once request is not cancelled but queued again, or dead-lettered when its
  attempts are used up (reason "attempts_exhausted")
- a hand-off whose receiver did not confirm it in time is taken back (_handoff.lua: to the next
  live park, or to the front of its level), so a caller whose request was handed to a receiver
  that died parked waits about one confirmation window, not a receiver timeout
- each id is judged alone: one call's ids may be in any state
]]
-- include: _body
-- include: _queue
-- include: _dead
-- include: _redeliver
-- include: _handoff
local now = server_ms()
local timeout = tonumber(ARGV[1])

local function read(id)
  local key = KEYS[1] .. id
  local st, rsp, why, hr, tk, rcv, pd, ma, ho = unpack(record_get(key, {'st', 'rsp', 'why',
    'hr', 'tk', 'rcv', 'pd', 'ma', 'ho'}))
  if not st then return {'missing', '', '', '', 0} end
  local function left()
    if pd then return tonumber(pd) - now end
    return ''
  end
  if st == 'handed' and tonumber(ho) and tonumber(ho) < now then
    local k = {hash = key, parked = KEYS[9], parks = KEYS[10], receipt_prefix = KEYS[11],
      run = KEYS[2], handoffs = KEYS[12], levels = KEYS[4], prefix = KEYS[5]}
    local o = {confirm_ms = ARGV[8], in_flight_ttl = ARGV[9], receipt_ttl = ARGV[10],
      list_ttl = ARGV[4], extra_ttl = ARGV[3], pulse = ARGV[7], node_prefix = ARGV[2]}
    st = reclaim(k, id, now, o, true)
  end
  if st == 'taken' and timeout > 0 then
    local last = math.max(tonumber(hr) or 0, tonumber(tk) or 0)
    if now - last > timeout and ma then
      local k = {hash = key, run = KEYS[2], lease = KEYS[3], levels = KEYS[4],
        prefix = KEYS[5], dead = {KEYS[6], KEYS[7], KEYS[8]}}
      local o = {extra_ttl = ARGV[3], list_ttl = ARGV[4], dead_ttl = ARGV[5],
        dead_cap = ARGV[6], pulse = ARGV[7], node_prefix = ARGV[2]}
      redeliver(k, id, now, o)
      st, why, pd = unpack(redis.call('HMGET', key, 'st', 'why', 'pd'))
      return {st, '', why or '', left(), 1}
    end
    if now - last > timeout then
      redis.call('HSET', key, 'st', 'cancelled', 'why', 'receiver_lost', 'dn', now)
      drop_body(key, {})
      redis.call('ZREM', KEYS[2], id)
      if rcv then
        redis.call('PUBLISH', ARGV[2] .. rcv, 'c|' .. id .. '|receiver_lost')
      end
      return {'cancelled', '', 'receiver_lost', left(), 0}
    end
  end
  return {st, rsp or '', why or '', left(), 0}
end

local out = {}
for i = 11, #ARGV do out[#out + 1] = read(ARGV[i]) end
return out
