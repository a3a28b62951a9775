--[[ enqueue: queue one request for its endpoint, or hand it to a parked receiver; once per id.

KEYS[1]  request hash          prq:{e}:r:<id>
KEYS[2]  queued levels         prq:{e}:pri      (see _queue.lua)
KEYS[3]  enqueue counter       prq:{e}:seq
KEYS[4]  parked tokens         prq:{e}:parked
KEYS[5]  park details          prq:{e}:parks    (token -> "<node>|<until, server ms>")
KEYS[6]  take receipt prefix   prq:{e}:t:       (the token is appended; same hash tag)
KEYS[7]  in-flight ids         prq:{e}:run      (zset: id -> last contact, server ms)
KEYS[8]  limits                prq:{e}:lim      (hash: mif, mp; absent = no limit)
KEYS[9]  level prefix          prq:{e}:l:       (the priority is appended; _queue.lua)
KEYS[10] leased ids            prq:{e}:alo      (zset: at_least_once ids in flight -> last contact)
KEYS[11] hand-offs             prq:{e}:ho       (zset: handed ids -> confirm deadline, server ms)
ARGV[1]  request id
ARGV[2]  request body (JSON)
ARGV[3]  sender node id (its channel gets the response pulse)
ARGV[4]  now_ms
ARGV[5]  how long a hand-off may wait for its receiver's confirmation, ms (_handoff.lua)
ARGV[6]  request TTL, ms
ARGV[7]  queue, counter and park TTL, ms
ARGV[8]  the endpoint's pulse channel
ARGV[9]  node channel prefix   prq:node:   (a parked receiver's node id is appended)
ARGV[10] TTL of a taken request, ms
ARGV[11] TTL of a take receipt, ms
ARGV[12] receiver timeout, ms: an in-flight entry not refreshed for this long holds no slot
ARGV[13] priority (an integer)
ARGV[14] producer (the fairness lane within the priority)
ARGV[15] max attempts: 0 for at_most_once; else the request is at_least_once (_redeliver.lua)
ARGV[16] pickup window, ms: the pickup deadline "pd" is this much after now by server time
         (TIME), the clock every take judges it by

Reply:
  {"new", counter}                      queued (and the endpoint pulsed if a receiver is
                                        parked); counter = the endpoint's enqueue count so far
  {"handed", counter}                   handed to a parked receiver (_handoff.lua): "handed" to
                                        its token, listed in its receipt, and its node pulsed
                                        "t|<token>|<id>"; not picked up until the receiver
                                        confirms it
  {"known", state, response, reason}    the id is known (not withdrawn); nothing was enqueued, the
                                        sender was only added as a watcher of the outcome; a
                                        "handed" request reads "queued" (not picked up)
  {"full", depth, max_pending}          the endpoint already holds max_pending queued requests;
                                        nothing was written

Invariants:
- a known id (queued, taken, answered or cancelled, until its hash expires) is never enqueued
  again, so a replay of this script after a lost reply changes nothing; a withdrawn id (it never
  ran) is enqueued afresh, so a caller may retry a PickupTimeout with the same id
- a request goes to a parked receiver only if nothing is queued (what waits goes first, in the
  order of _queue.lua) and its park is live by server time; stale parks are
  dropped; a hand-off is recorded in the token's receipt, so a lost pulse loses nothing, and
  one that is not confirmed in time is reclaimed for another receiver (_handoff.lua)
- the hash is written together with its TTL; the queue, counter and park TTLs are refreshed
- the counter only grows while Redis keeps its data and the key lives (nodes use it to notice a
  rollback; their data-loss checks refresh its TTL while they compare against it, and it expires
  a list TTL after the last node stopped using the endpoint)
- a handed-off request is listed in the in-flight set (take.lua does the same for what it takes)
  and in the hand-off set, until it is confirmed or reclaimed
- capacity: no new request while max_pending ids are queued; no hand-off while max_in_flight
  requests are in flight (entries refreshed within the receiver timeout), it is queued instead
- a queued request joins its priority level, in its producer's turn (_queue.lua)
- the request's sequence number "sq" is the counter's value: unique per endpoint while Redis
  keeps its data and the counter lives (receivers track what they took and ran by it, per life
  of the counter)
]]
-- include: _body
-- include: _queue
-- include: _handoff
local state = record_hmget(KEYS[1], {'st'})[1]  -- (the hash form: a watcher may join below)
if state == 'withdrawn' then
  -- it never ran and never will: a retry with the same id is a fresh request
  redis.call('DEL', KEYS[1])
  state = nil
end
if state then
  local snd, watchers, rsp, why = unpack(redis.call('HMGET', KEYS[1], 'snd', 'w', 'rsp', 'why'))
  if snd ~= ARGV[3] then
    watchers = watchers or ''
    if not string.find(' ' .. watchers .. ' ', ' ' .. ARGV[3] .. ' ', 1, true) then
      redis.call('HSET', KEYS[1], 'w', watchers .. ' ' .. ARGV[3])
    end
  end
  if state == 'handed' then state = 'queued' end
  return {'known', state, rsp or '', why or ''}
end

local max_pending, max_in_flight = unpack(redis.call('HMGET', KEYS[8], 'mp', 'mif'))
max_pending, max_in_flight = limit(max_pending), limit(max_in_flight)
if max_pending then
  local depth = queue_depth(KEYS[2], KEYS[9])
  if depth >= max_pending then return {'full', depth, max_pending} end
end

local counter = redis.call('INCR', KEYS[3])
redis.call('PEXPIRE', KEYS[3], ARGV[7])

local now = server_ms()
-- the record, queued (a hand-off below makes it 'handed', adding that state's fields)
local fields = body_fields({'st', 'queued', 'snd', ARGV[3], 'ct', ARGV[4],
  'pd', now + tonumber(ARGV[16]), 'sq', counter}, ARGV[2])
if ARGV[13] ~= '0' then  -- absent reads as priority 0 everywhere
  fields[#fields + 1] = 'pri'
  fields[#fields + 1] = ARGV[13]
end
if tonumber(ARGV[15]) > 0 then
  for _, v in ipairs({'ma', ARGV[15], 'pw', ARGV[16], 'pro', ARGV[14]}) do
    fields[#fields + 1] = v
  end
end
redis.call('HSET', KEYS[1], unpack(fields))

-- while anything waits in the queue, it goes first: parked receivers are woken by the pulse
local handing = redis.call('EXISTS', KEYS[2]) == 0
if handing and max_in_flight then
  local live = redis.call('ZCOUNT', KEYS[7], now - tonumber(ARGV[12]), '+inf')
  handing = live < max_in_flight
end
if handing then
  local k = {hash = KEYS[1], parked = KEYS[4], parks = KEYS[5], receipt_prefix = KEYS[6],
    run = KEYS[7], handoffs = KEYS[11]}
  local o = {confirm_ms = ARGV[5], in_flight_ttl = ARGV[10], receipt_ttl = ARGV[11],
    list_ttl = ARGV[7], node_prefix = ARGV[9]}
  if hand_off(k, ARGV[1], now, o) then return {'handed', counter} end
end

redis.call('PEXPIRE', KEYS[1], ARGV[6])
queue_push(KEYS[2], KEYS[9], ARGV[13], ARGV[14], {ARGV[1]}, ARGV[7], now)
-- only a parked receiver waits for the pulse: one that is not parked is taking or handling,
-- and takes again before it parks (a take parks only while nothing is queued)
if redis.call('EXISTS', KEYS[4]) == 1 then redis.call('PUBLISH', ARGV[8], '') end
return {'new', counter}
