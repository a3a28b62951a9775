--[[ enqueue: queue one request for its endpoint, or hand it to a parked receiver; once per id.

KEYS[1]  request hash          prq:{e}:r:<id>
KEYS[2]  queued levels         prq:{e}:lv       (see _queue.lua)
KEYS[3]  enqueue counter       prq:{e}:seq
KEYS[4]  parked tokens         prq:{e}:parked
KEYS[5]  park details          prq:{e}:parks    (token -> "<node>|<until, server ms>")
KEYS[6]  take receipt prefix   prq:{e}:t:       (the token is appended; same hash tag)
KEYS[7]  in-flight ids         prq:{e}:run      (zset: id -> last contact, server ms)
KEYS[8]  limits                prq:{e}:lim      (hash: mif, mp; absent = no limit)
KEYS[9]  level prefix          prq:{e}:q:       (the priority is appended; _queue.lua)
KEYS[10] leased ids            prq:{e}:alo      (zset: at_least_once ids in flight -> last contact)
ARGV[1]  request id
ARGV[2]  request body (JSON)
ARGV[3]  sender node id (its channel gets the response pulse)
ARGV[4]  now_ms
ARGV[5]  pickup deadline, ms since the epoch
ARGV[6]  request TTL, ms
ARGV[7]  queue, counter and park TTL, ms
ARGV[8]  the endpoint's pulse channel
ARGV[9]  node channel prefix   prq:node:   (a parked receiver's node id is appended)
ARGV[10] TTL of a taken request, ms
ARGV[11] TTL of a take receipt, ms
ARGV[12] largest body carried inside a hand-off pulse, bytes
ARGV[13] receiver timeout, ms: an in-flight entry not refreshed for this long holds no slot
ARGV[14] priority (an integer)
ARGV[15] producer (the fairness lane within the priority)
ARGV[16] max attempts: 0 for at_most_once; else the request is at_least_once (_redeliver.lua)
ARGV[17] pickup window, ms (an at_least_once request handed out again gets it afresh)

Reply:
  {"new", counter}                      queued (and the endpoint pulsed); counter = the
                                        endpoint's enqueue count so far
  {"handed", counter}                   handed to a parked receiver: taken by its token, listed
                                        in its receipt, and the request sent in a pulse to it:
                                        "t|<token>|<id>|1|<sequence>|<body>" (body left out
                                        when larger than ARGV[12])
  {"known", state, response, reason}    the id is known (not withdrawn); nothing was enqueued, the
                                        sender was only added as a watcher of the outcome
  {"full", depth, max_pending}          the endpoint already holds max_pending queued requests;
                                        nothing was written

Invariants:
- a known id (queued, taken, answered or cancelled, until its hash expires) is never enqueued
  again, so a replay of this script after a lost reply changes nothing; a withdrawn id (it never
  ran) is enqueued afresh, so a caller may retry a PickupTimeout with the same id
- a request goes to a parked receiver only if its park is live by server time; stale parks are
  dropped; a hand-off is recorded in the token's receipt, so a lost pulse loses nothing
- the hash is written together with its TTL; the queue, counter and park TTLs are refreshed
- the counter only grows while Redis keeps its data (nodes use it to notice a rollback)
- a handed-off request is listed in the in-flight set (take.lua does the same for what it takes)
- capacity: no new request while max_pending ids are queued; no hand-off while max_in_flight
  requests are in flight (entries refreshed within the receiver timeout), it is queued instead
- a queued request joins its priority level, in its producer's turn (_queue.lua)
- the request's sequence number "sq" is the counter's value: unique per endpoint while Redis
  keeps its data (receivers track the at_least_once ones they ran by it)
]]
-- include: _queue
local state = redis.call('HGET', KEYS[1], 'st')
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

local now_server = nil
local tries = 100
if max_in_flight then
  now_server = server_ms()
  local live = redis.call('ZCOUNT', KEYS[7], now_server - tonumber(ARGV[13]), '+inf')
  if live >= max_in_flight then tries = 0 end
end
-- what the hash holds in every state (the state's own fields are added to it)
local fields = {'b', ARGV[2], 'snd', ARGV[3], 'ct', ARGV[4], 'pd', ARGV[5], 'pri', ARGV[14],
  'sq', counter}
local alo = tonumber(ARGV[16]) > 0
if alo then
  for _, v in ipairs({'ma', ARGV[16], 'pw', ARGV[17], 'pro', ARGV[15]}) do
    fields[#fields + 1] = v
  end
end
local function hset(...)
  local args = {...}
  for _, v in ipairs(fields) do args[#args + 1] = v end
  redis.call('HSET', KEYS[1], unpack(args))
end

for _ = 1, tries do
  local token = redis.call('LPOP', KEYS[4])
  if not token then break end
  local park = redis.call('HGET', KEYS[5], token)
  redis.call('HDEL', KEYS[5], token)
  local sep = park and string.find(park, '|', 1, true)
  if sep then
    now_server = now_server or server_ms()
    local node = string.sub(park, 1, sep - 1)
    local until_ms = tonumber(string.sub(park, sep + 1))
    if until_ms and until_ms >= now_server then
      hset('st', 'taken', 'att', '1', 'own', token, 'rcv', node, 'tk', now_server)
      redis.call('PEXPIRE', KEYS[1], ARGV[10])
      redis.call('ZADD', KEYS[7], now_server, ARGV[1])
      redis.call('PEXPIRE', KEYS[7], ARGV[7])
      if alo then
        redis.call('ZADD', KEYS[10], now_server, ARGV[1])
        redis.call('PEXPIRE', KEYS[10], ARGV[7])
      end
      local receipt = KEYS[6] .. token
      redis.call('RPUSH', receipt, ARGV[1])
      redis.call('PEXPIRE', receipt, ARGV[11])
      local msg = 't|' .. token .. '|' .. ARGV[1] .. '|1|' .. counter .. '|'
      if string.len(ARGV[2]) <= tonumber(ARGV[12]) then
        msg = msg .. ARGV[2]
      end
      redis.call('PUBLISH', ARGV[9] .. node, msg)
      return {'handed', counter}
    end
  end
end

hset('st', 'queued', 'att', '0')
redis.call('PEXPIRE', KEYS[1], ARGV[6])
queue_push(KEYS[2], KEYS[9], ARGV[14], ARGV[15], {ARGV[1]}, ARGV[7])
redis.call('PUBLISH', ARGV[8], '')
return {'new', counter}
