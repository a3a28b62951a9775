--[[ _body: where a request's body lives in its record (the hash prq:{e}:r:<id>).
Scripts include this file where they say `-- include: _body`; it is not a script of its own.
prq/records.py spells the same layout for Python readers.

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

-- delete the body of `key`, and the other fields named in `also` (an array, may be empty)
local function drop_body(key, also)
  local names = {'b', 'bk'}
  local pieces = tonumber(redis.call('HGET', key, 'bk'))
  if pieces then
    for i = 1, math.min(pieces, MAX_PIECES) - 1 do names[#names + 1] = 'b' .. i end
  end
  for _, name in ipairs(also) do names[#names + 1] = name end
  redis.call('HDEL', key, unpack(names))
end
