--[[ enqueue_many: queue a batch of detached requests for one endpoint; once per id.

Detached requests (bulk enqueue, e.g. from Spark) have no sender node waiting on a pulse: the
response is kept under the request id (response TTL) for whoever asks, and no sender liveness is
judged (beat.lua judges a sender only when the request names one).

KEYS[1]  queued levels         prq:{e}:pri  (see _queue.lua)
KEYS[2]  enqueue counter       prq:{e}:seq
KEYS[3]  request hash prefix   prq:{e}:r:   (ids are appended; same hash tag, same slot)
KEYS[4]  limits                prq:{e}:lim  (hash: mp = max pending; absent = no limit)
KEYS[5]  level prefix          prq:{e}:l:   (the priority is appended)
ARGV[1]  batch nonce (the same when the call is retried)
ARGV[2]  now_ms (the enqueuer's clock: the requests' creation time)
ARGV[3]  pickup window, ms: the pickup deadline "pd" is this much after now by server time
         (TIME), the clock every take judges it by; an at_least_once request handed out again
         gets it afresh
ARGV[4]  request TTL, ms
ARGV[5]  queue and counter TTL, ms
ARGV[6]  the endpoint's pulse channel
ARGV[7]  priority of the batch's requests (an integer)
ARGV[8]  their producer (the fairness lane within the priority)
ARGV[9]  max attempts: 0 for at_most_once; else the requests are at_least_once (enqueue.lua)
ARGV[10] 1: one-way messages (notify): their answers are not kept (apply_response.lua); else 0
ARGV[11..] id1, body1, id2, body2, ...

Reply: {accepted, duplicates, counter, refused, dup_id1, ..., refused_id1, ...}
  accepted   = requests of this batch now queued (by this call, or by an earlier run of the very
               same batch whose reply was lost: counted again, so a retried call reports what
               the batch did, not what the retry did)
  duplicates = ids already known from elsewhere (queued, running, answered or cancelled by
               another batch or caller): nothing was enqueued for them; their ids follow
  counter    = the endpoint's enqueue counter after the batch
  refused    = new ids not written because max_pending ids were already queued (capacity);
               their ids follow the duplicates' (send them again later)

Invariants:
- a known id is never enqueued again (as in enqueue.lua); a withdrawn id is enqueued afresh
- a replay of the batch (same nonce) enqueues nothing more and reports the same counts
- each record is written with its TTL, in the queued form (_body.lua); the ids are queued in batch order, one producer's turns
- one pulse for the batch, only when something was queued
- each new request's sequence number "sq" is the counter's value for it, in batch order
- capacity: new requests are written only while fewer than max_pending ids are queued
]]
-- include: _body
-- include: _queue
local prefix, nonce, now, ttl = KEYS[3], ARGV[1], ARGV[2], ARGV[4]
local deadline = server_ms() + tonumber(ARGV[3])
local fresh = {}
local accepted, duplicates = 0, 0
local dups, refused = {}, {}
local room = limit(redis.call('HGET', KEYS[4], 'mp'))
if room then room = room - queue_depth(KEYS[1], KEYS[5]) end
local sequence = tonumber(redis.call('GET', KEYS[2]) or '0')
-- every record of the batch is one string in the queued form (_body.lua): what the batch
-- shares around its sequence number, then its body
local head = QUEUED_TAG .. now .. ',' .. deadline .. ','
local tail = {',', queued_field('bn', nonce)}
if ARGV[7] ~= '0' then tail[#tail + 1] = queued_field('pri', ARGV[7]) end  -- absent reads as 0
if tonumber(ARGV[9]) > 0 then
  tail[#tail + 1] = queued_field('ma', ARGV[9])
  tail[#tail + 1] = queued_field('pw', ARGV[3])
  tail[#tail + 1] = queued_field('pro', ARGV[8])
end
if ARGV[10] == '1' then tail[#tail + 1] = queued_field('ow', '1') end
tail[#tail + 1] = 'b:'
tail = table.concat(tail)

-- write id's record as the next request, unless the id is known; true when written
local function write(key, body)
  if not redis.call('SET', key, head .. (sequence + 1) .. tail .. body, 'PX', ttl, 'NX') then
    return false
  end
  sequence = sequence + 1
  return true
end

-- an id the first write did not take (known, or no room): what it is. A withdrawn record (a
-- retry of it is a fresh request) or one without a state (damaged) is replaced: 'fresh'
local function settle(key, body)
  if redis.call('EXISTS', key) == 1 then
    local st, bn = unpack(record_get(key, {'st', 'bn'}))
    if st and st ~= 'withdrawn' then
      if bn == nonce then return 'again' end
      return 'known'
    end
    redis.call('DEL', key)
    if (not room or room > 0) and write(key, body) then return 'fresh' end
  end
  return 'refused'
end

-- the common case (a new id, room left) is one SET; the rest is settled above
local n = 0
for i = 11, #ARGV, 2 do
  local id = ARGV[i]
  local key = prefix .. id
  local verdict
  if (not room or room > 0) and redis.call('SET', key, head .. (sequence + 1) .. tail ..
      ARGV[i + 1], 'PX', ttl, 'NX') then
    sequence = sequence + 1
    verdict = 'fresh'
  else
    verdict = settle(key, ARGV[i + 1])
  end
  if verdict == 'fresh' then
    if room then room = room - 1 end
    n = n + 1
    fresh[n] = id
    accepted = accepted + 1
  elseif verdict == 'refused' then
    refused[#refused + 1] = id
  elseif verdict == 'again' then
    accepted = accepted + 1
  else
    duplicates = duplicates + 1
    dups[#dups + 1] = id
  end
end

local counter
if #fresh > 0 then
  queue_push(KEYS[1], KEYS[5], ARGV[7], ARGV[8], fresh, ARGV[5])
  counter = redis.call('INCRBY', KEYS[2], #fresh)
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
  redis.call('PUBLISH', ARGV[6], '')
else
  counter = tonumber(redis.call('GET', KEYS[2]) or '0')
end
local out = {accepted, duplicates, counter, #refused}
for _, id in ipairs(dups) do out[#out + 1] = id end
for _, id in ipairs(refused) do out[#out + 1] = id end
return out
