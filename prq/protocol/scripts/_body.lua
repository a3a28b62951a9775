--[[ _body: where a request's body lives in its record (the hash prq:{e}:r:<id>).
Scripts include this file where they say `-- include: _body`; it is not a script of its own.
prq/core/records.py spells the same layout for Python readers.

Redis keeps a small hash in one compact block (listpack encoding) only while every value is at
most hash-max-listpack-value bytes (64 by default); one longer value turns the whole record into
a table of separately allocated fields, about twice the memory. So a body of up to
CHUNKED_MAX bytes is cut into CHUNK-byte pieces:
  b          the first piece (or the whole body when it is longer than CHUNKED_MAX, or short)
  b1 .. bN   the pieces after it, in order; every piece but the last is exactly CHUNK bytes
  bk         N + 1, the number of pieces; absent when the body is in 'b' alone
A record without 'bk' (written so, or by an earlier prq) holds its body in 'b'. The pieces are
written, read and dropped together by the helpers below, never one by one.
]]
local CHUNK = 64
local CHUNKED_MAX = 4096
local MAX_PIECES = CHUNKED_MAX / CHUNK

-- write the field/value pairs that store `body` into the array `out` after its first `n`
-- entries (what is beyond is left as it was: a caller may reuse one array); the new length
local function body_fields_at(out, n, body)
  local size = #body
  out[n + 1] = 'b'
  if size <= CHUNK or size > CHUNKED_MAX then
    out[n + 2] = body
    return n + 2
  end
  out[n + 2] = string.sub(body, 1, CHUNK)
  n = n + 2
  local pieces = math.ceil(size / CHUNK)
  for i = 1, pieces - 1 do
    out[n + 1] = 'b' .. i
    out[n + 2] = string.sub(body, i * CHUNK + 1, (i + 1) * CHUNK)
    n = n + 2
  end
  out[n + 1] = 'bk'
  out[n + 2] = pieces
  return n + 2
end

-- append the field/value pairs that store `body` to the array `out`
local function body_fields(out, body)
  body_fields_at(out, #out, body)
  return out
end

-- the body whose first piece `first` and piece count `pieces` ('bk') were read from `key`
local function body_rest(key, first, pieces)
  pieces = tonumber(pieces)
  if not first or not pieces or pieces < 2 then return first end
  if pieces > MAX_PIECES then return nil end  -- not a count prq writes
  local names = {}
  for i = 1, pieces - 1 do names[i] = 'b' .. i end
  local parts = redis.call('HMGET', key, unpack(names))
  for i = 1, #parts do
    if not parts[i] then return nil end  -- a record cut short: no body to hand out
  end
  return first .. table.concat(parts)
end

-- the body stored in `key`, or nil
local function read_body(key)
  local first, pieces = unpack(redis.call('HMGET', key, 'b', 'bk'))
  return body_rest(key, first, pieces)
end

-- the field names a read of a record asks for after 'b' and 'bk', so that a body of up to
-- #BODY_AHEAD + 1 pieces (256 bytes) comes in that same read (body_read joins them): the
-- common body costs no second HMGET
local BODY_AHEAD = {'b1', 'b2', 'b3'}

-- the body from one read that asked for 'b', 'bk' and then the BODY_AHEAD names, their values
-- at reply[at], reply[at + 1], ...; a longer body is read from `key`
local function body_read(key, reply, at)
  local first, pieces = reply[at], tonumber(reply[at + 1])
  if not first or not pieces or pieces < 2 then return first end
  if pieces > #BODY_AHEAD + 1 then return body_rest(key, first, pieces) end
  local parts = {first}
  for i = 1, pieces - 1 do
    local part = reply[at + 1 + i]
    if not part then return nil end  -- a record cut short: no body to hand out
    parts[i + 1] = part
  end
  return table.concat(parts)
end

-- delete the body of `key`, and the other fields named in `also` (an array, may be empty);
-- `pieces`: its 'bk' when the caller read it already (false when absent), else nil
local function drop_body(key, also, pieces)
  local names = {'b', 'bk'}
  if pieces == nil then pieces = redis.call('HGET', key, 'bk') end
  pieces = tonumber(pieces)
  if pieces then
    for i = 1, math.min(pieces, MAX_PIECES) - 1 do names[#names + 1] = 'b' .. i end
  end
  for _, name in ipairs(also) do names[#names + 1] = name end
  redis.call('HDEL', key, unpack(names))
end

-- append to `out` the field/value pairs that empty the body fields of a record whose 'bk' is
-- `pieces` (false when absent): a body dropped in the write that changes the record, not by a
-- command of its own (readers take an empty 'b' for no body: prq/core/records.py join_body)
local function blank_body(out, pieces)
  out[#out + 1] = 'b'
  out[#out + 1] = ''
  pieces = tonumber(pieces)
  if pieces then
    for i = 1, math.min(pieces, MAX_PIECES) - 1 do
      out[#out + 1] = 'b' .. i
      out[#out + 1] = ''
    end
    out[#out + 1] = 'bk'
    out[#out + 1] = ''
  end
  return out
end

--[[ The queued form. A request queued by enqueue_many is kept as one string rather than a hash
until something changes it: `SET key value PX ttl NX` checks the id, writes the record and its
TTL in one command, and a string costs Redis less memory and CPU than a hash. It comes in two
shapes, told apart by their first two bytes:
  'Q1' ct ',' pd ',' sq ','      its creation time, pickup deadline and sequence number inline
                                 (decimal integers): what the script builds, for small batches
  'Q2' ct ',' ix ','             its creation time and its place ix (1, 2, ...) in its batch:
                                 the enqueuer builds the whole string, and the script stores it
                                 as it came; the batch's pickup deadline, first sequence number
                                 and nonce are kept once, in its shared head (below, named by
                                 the field 'bh'), and the request's sequence number is that
                                 first one plus ix - 1
then named fields: a name (lowercase letters), the value's length in bytes, ':', the value; the
last field, 'b' (the body), has no length and runs to the end. For instance
  Q11764000000000,1764000060000,7,bn11:kQ3xv9Zr_0ab:{"m":"echo"}
  Q21764000000000,3,bh11:Zr_0akQ3xv9b:{"m":"echo"}
The shared head of a batch is the string prq:{e}:bh:<token> (a token the enqueuer draws for each
batch call, the same when that call is sent again), "pd,sq1,bn", with the requests' TTL: written
at the batch's first new request, its TTL renewed by a rerun, so it outlives them. A head gone
(evicted) leaves its requests without a deadline, sequence number or nonce, read as unknown.
It is a queued record ('st' is implied): record_get reads its fields as HMGET reads a hash's,
and record_open turns it into the hash form (same key, same TTL, the body in pieces, 'pd' and
'sq' written out) before a script changes it (pickup, cancel, withdraw). prq/core/records.py reads
the same forms in Python.
]]
local QUEUED_TAG = 'Q1'
local QUEUED_MAX_FIELDS = 16
-- the Q2 shared heads read during this call, by key: a batch's records share one, which does
-- not change once written, so a take of many of them reads it once
local shared_heads = {}

-- the key of the shared head `token`, beside the record `key` or the records' prefix (same
-- endpoint)
local function shared_head_key(key, token)
  local tag = string.match(key, '^(.-}):r:')
  if not tag then return nil end
  return tag .. ':bh:' .. token
end

-- the fields of the queued-form string `s` kept under `key` as a table (name -> value;
-- 'st' = 'queued'); nil when the string is not in that form
local function queued_fields(key, s)
  local out, pos, ix
  local ct, pd, sq, at = string.match(s, '^Q1(%d+),(%d+),(%d+),()')
  if ct then
    out, pos = {st = 'queued', ct = ct, pd = pd, sq = sq}, at
  else
    ct, ix, at = string.match(s, '^Q2(%d+),(%d+),()')
    if not ct then return nil end
    out, pos = {st = 'queued', ct = ct}, at
  end
  for _ = 1, QUEUED_MAX_FIELDS do
    local name, digits, start = string.match(s, '^(%l+)(%d*):()', pos)
    if not name then return nil end
    if digits == '' then
      out[name] = string.sub(s, start)
      break
    end
    local stop = start + tonumber(digits) - 1
    if stop > #s then return nil end
    out[name] = string.sub(s, start, stop)
    pos = stop + 1
  end
  if not out.b then return nil end
  if ix and out.bh then
    local head = shared_head_key(key, out.bh)
    local shared = head and shared_heads[head]
    if head and not shared then
      shared = redis.call('GET', head)
      shared_heads[head] = shared or nil  -- (one missing may be written later in this call)
    end
    local deadline, first, nonce = string.match(shared or '', '^(%d+),(%d+),(.*)$')
    if deadline then
      out.pd, out.bn = deadline, nonce
      -- (16 digits: tostring would keep 14, _sequence.lua)
      out.sq = string.format('%.0f', tonumber(first) + tonumber(ix) - 1)
    end
  end
  return out
end

-- like HMGET key names..., for a record in either form (a string not in the queued form reads
-- as a queued record whose body is that string: whoever decodes the body finds it bad); and,
-- for a string, all its fields (name -> value), else nil. A hash (or no key) costs the HMGET
-- alone; only a string's answer is an error, caught. With `string_first` (the caller expects
-- the queued form: the record before it was one) it asks GET first, and a string (or no key)
-- costs the GET alone, a hash a failed GET and the HMGET
local function record_read(key, names, string_first)
  local raw
  if string_first then
    raw = redis.pcall('GET', key)
    if type(raw) == 'table' and raw.err then
      return redis.call('HMGET', key, unpack(names)), nil
    end
    if not raw then
      local out = {}
      for i = 1, #names do out[i] = false end
      return out, nil
    end
  else
    local reply = redis.pcall('HMGET', key, unpack(names))
    if not reply.err then return reply, nil end
    raw = redis.call('GET', key)
  end
  local fields = queued_fields(key, raw) or {st = 'queued', b = raw}
  local out = {}
  for i, name in ipairs(names) do out[i] = fields[name] or false end
  return out, fields
end

-- record_read's values alone
local function record_get(key, names)
  return (record_read(key, names))
end

-- append to `out` the field/value pairs that write the fields of a queued-form record
-- (`fields`, as record_read gives them) as a hash, its body in pieces; names in `skip` (a set,
-- may be nil) are left out, for the caller to write its own values
local function opened_fields(out, fields, skip)
  for name, value in pairs(fields) do
    if name ~= 'b' and not (skip and skip[name]) then
      out[#out + 1] = name
      out[#out + 1] = value
    end
  end
  return body_fields(out, fields.b or '')
end

-- turn a record in the queued form into the hash form, keeping its TTL; nothing for a hash or
-- no key
local function record_open(key)
  if redis.call('TYPE', key)['ok'] ~= 'string' then return end
  local raw = redis.call('GET', key)
  local ttl = redis.call('PTTL', key)
  local flat = opened_fields({}, queued_fields(key, raw) or {st = 'queued', b = raw})
  redis.call('DEL', key)
  redis.call('HSET', key, unpack(flat))
  if ttl > 0 then redis.call('PEXPIRE', key, ttl) end
end

-- HMGET key names... of a record in the hash form, turning one in the queued form into it first
-- (for a script that writes to it next); a hash (or no key) costs the HMGET alone
local function record_hmget(key, names)
  local reply = redis.pcall('HMGET', key, unpack(names))
  if not reply.err then return reply end
  record_open(key)
  return redis.call('HMGET', key, unpack(names))
end
