--[[ enqueue_many: queue a batch of detached requests for one endpoint; once per id.

Detached requests (bulk enqueue, e.g. from Spark) have no sender node waiting on a pulse: the
response is kept under the request id (response TTL) for whoever asks, and no sender liveness is
judged (beat.lua judges a sender only when the request names one).

KEYS[1]  queued levels         prq:{e}:pri  (see _queue.lua)
KEYS[2]  enqueue counter       prq:{e}:seq
KEYS[3]  request hash prefix   prq:{e}:r:   (ids are appended; same hash tag, same slot)
KEYS[4]  limits                prq:{e}:lim  (hash: mp = max pending; absent = no limit)
KEYS[5]  level prefix          prq:{e}:l:   (the priority is appended)
KEYS[6]  sequence numbers      prq:{e}:sq   (the last one given; _sequence.lua)
KEYS[7]  the batch's dedup ledger, when it has one: prq:{e}:dd:<token> (a set: the ids of its
         requests a receiver took, take.lua; and '.', so that it exists while its requests
         wait); each record then names the token in its field 'dd'
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
ARGV[9]  the queued form's shape the batch comes in (_body.lua):
           Q1  ARGV[15..] = id1, rest1, id2, rest2, ...: each record is written as 'Q1', the
               creation time (ARGV[2]), deadline and sequence number, then its rest (its named
               fields, the batch nonce 'bn' first, and body, as the enqueuer spelled them); for
               small batches
           Q2  ARGV[15..] = key1, record1, key2, record2, ...: each record's key (KEYS[3] and
               its id) and its whole string ('Q2', creation time and place in the batch, the
               head's token 'bh' first, other fields and body), stored as it came; the batch's
               shared head says its deadline, first sequence number and nonce
         the other fields: priority, attempts, pickup window, producer and one-way, as for a
         hash (enqueue.lua), only when set; and a request's fingerprint 'fp' (its method and
         params hashed by the enqueuer: prq.bulk.fingerprints), when it has one, as its first
         named field (in Q1, first of its rest), where `fingerprint_of` finds it
ARGV[10] Q2: the token of the batch's shared head, prq:{e}:bh:<token> (drawn for this call,
         the same when the call is sent again)
ARGV[11] the ledger's TTL, ms, renewed by every batch ('0' without a ledger)
ARGV[12] '1': retry failures: an id whose record says it ended without an answer for a reason
         worth another try (RETRIED: data loss, a lost receiver, a receiver shut down, its
         attempts used up) is enqueued afresh, as a withdrawn one is; '0': it is known
ARGV[13] with a task attempt (prq.bulk.TaskAttempt): the nonces of the attempt's batches begin
         with this ("<task>/<attempt>/"), so an id this attempt wrote in another batch is a
         repeat, not a duplicate nor accepted again; '' without
ARGV[14] with a task attempt: the nonces of every attempt of the task begin with this
         ("<task>/"), so an id an earlier attempt wrote is accepted again (as a rerun of its
         very batch is); '' without

Reply: {accepted, duplicates, counter, refused, depth, gone, repeats, conflicts, dup_id1, ...,
        refused_id1, ..., gone_id1, ..., repeat_id1, ..., conflict_id1, ...}
  accepted   = requests of this batch now queued (by this call, or by an earlier run of the very
               same batch whose reply was lost: counted again, so a retried call reports what
               the batch did, not what the retry did)
  duplicates = ids already known from elsewhere (queued, running, answered or cancelled by
               another batch or caller): nothing was enqueued for them; their ids follow
  counter    = the endpoint's enqueue counter after the batch (how many it enqueued)
  refused    = new ids not written because max_pending ids were already queued (capacity);
               their ids follow the duplicates' (send them again later)
  depth      = the endpoint's queued requests after the batch (over all levels): what a bulk
               enqueuer holds itself back by (backpressure)
  gone       = ids the batch's ledger holds whose record is gone (a receiver took them, and
               their outcome has expired since): nothing was enqueued for them; their ids
               follow the refused ones
  repeats    = ids the same task attempt wrote in another of its batches (ARGV[13]): nothing
               was enqueued for them; their ids follow the gone ones
  conflicts  = known ids whose record's fingerprint differs from the new request's (both
               have one): another request (other params) holds the id, so its outcome is not
               the new one's; nothing was enqueued for them; their ids follow the repeats

Invariants:
- a known id is never enqueued again (as in enqueue.lua); a withdrawn id is enqueued afresh,
  and with ARGV[12] one that failed for a reason worth another try
- with a ledger, nor is an id a receiver took before, for as long as the ledger lives, though
  its record is gone; an id no receiver took (its record withdrawn or expired unanswered) is
  enqueued afresh
- a replay of the batch (same nonce) enqueues nothing more and reports the same counts; so
  does a later attempt of the same task (ARGV[14]) for what an earlier one enqueued, while an
  id the same attempt sent in another batch is a repeat (ARGV[13])
- a known id that another batch wrote is a conflict, not a duplicate, when the record and the
  new request both carry a fingerprint and they differ (an earlier attempt of the same task
  too: its rows were other ones); without both fingerprints it is what it was before. Only
  ids found known pay for the check (the new ones are one SET, as before)
- each record is written with its TTL, in the queued form (_body.lua); the ids are queued in batch order, one producer's turns
- one pulse for the batch, only when something was queued
- each new request's sequence number "sq" is one the endpoint gave it (_sequence.lua), in batch
  order; in the Q2 shape the batch takes one number per place at its first new request (ids
  known already leave theirs unused; a batch that queues nothing takes none), the same on a
  rerun, so the strings the enqueuer built stay true
- capacity: new requests are written only while fewer than max_pending ids are queued
]]
-- include: _body
-- include: _queue
-- include: _sequence
local prefix, nonce, ttl, shape = KEYS[3], ARGV[1], ARGV[4], ARGV[9]
local FIRST = 15
local attempt_of, task_of = ARGV[13], ARGV[14]
local RETRIED = {data_loss = true, receiver_lost = true, receiver_shutdown = true,
  attempts_exhausted = true}
local retry = ARGV[12] == '1'
local fresh, dups, refused, gone, repeats, conflicts = {}, {}, {}, {}, {}, {}
local room = limit(redis.call('HGET', KEYS[4], 'mp'))
if room then room = room - queue_depth(KEYS[1], KEYS[5]) end
local now = server_ms()
-- Q1: the last number given so far (the next is at least the clock), written back at the end
local sequence = nil
local shared, reserved, head = nil, false, nil
if shape == 'Q2' then
  -- one head per batch: a rerun finds the numbers its first run took, and keeps them
  shared = shared_head_key(prefix, ARGV[10])
  reserved = redis.call('EXISTS', shared) == 1
else
  head = QUEUED_TAG .. ARGV[2] .. ',' .. (now + tonumber(ARGV[3])) .. ','
end

-- Q2: at the batch's first new request, its numbers (one per place) and its head; a batch
-- that queues nothing takes none
local function reserve()
  if reserved then return end
  reserved = true
  local places = (#ARGV - FIRST + 1) / 2
  local deadline = now + tonumber(ARGV[3])
  local first = take_numbers(KEYS[6], places, ARGV[5])
  redis.call('SET', shared, deadline .. ',' .. number_text(first) .. ',' .. nonce, 'PX', ttl)
  redis.call('INCRBY', KEYS[2], places)
end

-- write a record unless its key is taken; true when written
local function write(key, record)
  return redis.call('SET', key, record, 'PX', ttl, 'NX') and true or false
end

-- the fingerprint of a record as the enqueuer spelled it (Q1 with its head, or Q2): its
-- first named field when that is 'fp', else nil
local function fingerprint_of(record)
  local digits, at = string.match(record, '^Q[12][%d,]*,fp(%d+):()')
  if not digits then return nil end
  return string.sub(record, at, at + tonumber(digits) - 1)
end

-- an id the first write did not take (known, or no room): what it is. A withdrawn record (a
-- retry of it is a fresh request), one without a state (damaged), or with `retry` one that
-- failed for a reason in RETRIED, is replaced: 'fresh'
local function settle(key, record)
  if redis.call('EXISTS', key) == 1 then
    local st, bn, why, fp = unpack(record_get(key, {'st', 'bn', 'why', 'fp'}))
    local retried = retry and st == 'cancelled' and RETRIED[why]
    -- this very batch sent again after a node withdrew the request (its first reply was lost):
    -- it stays withdrawn, as whoever withdrew it was told
    if st == 'withdrawn' and bn == nonce then return 'again' end
    if st and st ~= 'withdrawn' and not retried then
      if bn == nonce then return 'again' end  -- this very batch, sent again
      if bn and attempt_of ~= '' and string.sub(bn, 1, #attempt_of) == attempt_of then
        return 'repeat'
      end
      if fp then
        local mine = fingerprint_of(record)
        if mine and mine ~= fp then return 'conflict' end  -- another request holds the id
      end
      if bn and task_of ~= '' and string.sub(bn, 1, #task_of) == task_of then return 'again' end
      return 'known'
    end
    redis.call('DEL', key)
    if (not room or room > 0) and write(key, record) then return 'fresh' end
  end
  return 'refused'
end

-- the ledger: which ids of the batch a receiver took before (1), in argument order
local ledger, taken_before = KEYS[7], nil
if ledger then
  local cut, ids = #prefix + 1, {}
  for i = FIRST, #ARGV, 2 do
    ids[#ids + 1] = shape == 'Q2' and string.sub(ARGV[i], cut) or ARGV[i]
  end
  taken_before = redis.call('SMISMEMBER', ledger, unpack(ids))
  redis.call('SADD', ledger, '.')
  redis.call('PEXPIRE', ledger, ARGV[11])
end

local n, again = 0, 0
local function tally(verdict, id)
  if verdict == 'fresh' then
    if room then room = room - 1 end
    if shared then reserve() else sequence = sequence + 1 end
    n = n + 1
    fresh[n] = id
  elseif verdict == 'refused' then
    refused[#refused + 1] = id
  elseif verdict == 'again' then
    again = again + 1
  elseif verdict == 'gone' then
    gone[#gone + 1] = id
  elseif verdict == 'repeat' then
    repeats[#repeats + 1] = id
  elseif verdict == 'conflict' then
    conflicts[#conflicts + 1] = id
  else
    dups[#dups + 1] = id
  end
end

-- an id of the ledger (taken before): what its record says, or 'gone' when it has none
local function settle_taken(key, record)
  if redis.call('EXISTS', key) == 1 then return settle(key, record) end
  return 'gone'
end

-- the common case (a new id, room left) is one SET; the rest is settled above. The Q2 loop
-- is the hot one (Spark, BulkClient): its strings go to Redis as they came

local call = redis.call
if shared then
  local cut = #prefix + 1
  for i = FIRST, #ARGV, 2 do
    local key = ARGV[i]
    if taken_before and taken_before[(i - FIRST) / 2 + 1] == 1 then
      tally(settle_taken(key, ARGV[i + 1]), string.sub(key, cut))
    elseif (not room or room > 0) and call('SET', key, ARGV[i + 1], 'PX', ttl, 'NX') then
      if room then room = room - 1 end
      if n == 0 then reserve() end
      n = n + 1
      fresh[n] = string.sub(key, cut)
    else
      tally(settle(key, ARGV[i + 1]), string.sub(key, cut))
    end
  end
else
  sequence = math.max(counter_value(KEYS[6]), clock_us() - 1)
  for i = FIRST, #ARGV, 2 do
    local key = prefix .. ARGV[i]
    local record = head .. number_text(sequence + 1) .. ',' .. ARGV[i + 1]
    if taken_before and taken_before[(i - FIRST) / 2 + 1] == 1 then
      tally(settle_taken(key, record), ARGV[i])
    elseif (not room or room > 0) and call('SET', key, record, 'PX', ttl, 'NX') then
      tally('fresh', ARGV[i])
    else
      tally(settle(key, record), ARGV[i])
    end
  end
end
local accepted, duplicates = n + again, #dups

local counter
if shared and n > 0 then
  redis.call('PEXPIRE', shared, ttl)  -- after the batch's last write: the head outlives them
end
if #fresh > 0 then
  queue_push(KEYS[1], KEYS[5], ARGV[7], ARGV[8], fresh, ARGV[5], now, ARGV[4])
  if shared then
    counter = tonumber(redis.call('GET', KEYS[2]))
  else
    counter = redis.call('INCRBY', KEYS[2], #fresh)
    redis.call('SET', KEYS[6], number_text(sequence), 'PX', ARGV[5])
  end
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
  redis.call('PUBLISH', ARGV[6], '')
else
  counter = tonumber(redis.call('GET', KEYS[2]) or '0')
end
local out = {accepted, duplicates, counter, #refused, queue_depth(KEYS[1], KEYS[5]), #gone,
  #repeats, #conflicts}
for _, list in ipairs({dups, refused, gone, repeats, conflicts}) do
  for _, id in ipairs(list) do out[#out + 1] = id end
end
return out
