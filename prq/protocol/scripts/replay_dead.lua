--[[ replay_dead: put a dead letter back in its endpoint's queue, once.

KEYS[1]  dead-lettered ids     prq:{e}:dead
KEYS[2]  their details         prq:{e}:deadm
KEYS[3]  their stored bytes    prq:{e}:deadb
KEYS[4]  request hash          prq:{e}:r:<id>
KEYS[5]  queued levels         prq:{e}:pri  (see _queue.lua)
KEYS[6]  enqueue counter       prq:{e}:seq
KEYS[7]  level prefix          prq:{e}:l:   (the priority is appended)
KEYS[8]  sequence numbers      prq:{e}:sq   (the last one given; _sequence.lua)
ARGV[1]  request id
ARGV[2]  now_ms (the replayed request's creation time)
ARGV[3]  pickup window, ms: the pickup deadline is this much after now by server time (TIME)
ARGV[4]  request TTL, ms
ARGV[5]  queue and counter TTL, ms
ARGV[6]  the endpoint's pulse channel

Reply: "replayed"  queued again (a fresh request under the same id, attempt count reset)
       "live"      the id is queued or in flight already: nothing was added
       "missing"   no dead letter under the id (never, purged, expired, or replayed before)

Invariants:
- in every case but "missing" the dead letter is removed (from all three keys), so replaying
  twice yields one live request
- a queued or taken id is never enqueued a second time; a final or expired one is replaced by
  a fresh queued request (body as stored, attempt count 0), with its TTL, queued and pulsed
- it is queued at the priority and for the producer its details name (0 and "" when they
  name none, e.g. undecodable bytes), as at_least_once when they name max attempts, with a
  fresh sequence number
]]
-- include: _body
-- include: _queue
-- include: _sequence
local body = redis.call('HGET', KEYS[3], ARGV[1])
if not body then return 'missing' end
local priority, producer, attempts = '0', '', nil
local ok, details = pcall(cjson.decode, redis.call('HGET', KEYS[2], ARGV[1]) or '')
if ok and type(details) == 'table' then
  local p = details.priority
  if type(p) == 'number' and p == math.floor(p) and math.abs(p) <= 2147483648 then
    priority = string.format('%d', p)
  end
  if type(details.producer) == 'string' then producer = details.producer end
  local m = details.max_attempts
  if type(m) == 'number' and m >= 1 and m <= 1000 and m == math.floor(m) then
    attempts = string.format('%d', m)
  end
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])

local st = record_get(KEYS[4], {'st'})[1]
if st == 'queued' or st == 'handed' or st == 'taken' then return 'live' end
redis.call('DEL', KEYS[4])
redis.call('INCR', KEYS[6])
redis.call('PEXPIRE', KEYS[6], ARGV[5])
local sequence = take_numbers(KEYS[8], 1, ARGV[5])
local now = server_ms()
local fields = {'st', 'queued', 'ct', ARGV[2], 'pd', now + tonumber(ARGV[3]),
  'sq', number_text(sequence)}
if tonumber(priority) ~= 0 then  -- absent reads as priority 0 everywhere
  fields[#fields + 1] = 'pri'
  fields[#fields + 1] = priority
end
redis.call('HSET', KEYS[4], unpack(body_fields(fields, body)))
if attempts then
  redis.call('HSET', KEYS[4], 'ma', attempts, 'pw', ARGV[3],
    'pro', producer)
end
redis.call('PEXPIRE', KEYS[4], ARGV[4])
queue_push(KEYS[5], KEYS[7], priority, producer, {ARGV[1]}, ARGV[5], now, ARGV[4])
redis.call('PUBLISH', ARGV[6], '')
return 'replayed'
