--[[ _redeliver: an at_least_once request whose receiver went silent is handed out again, or,
with its attempts used up, dead-lettered. Needs _body, _queue and _dead (included before it).
Scripts include this file where they say `-- include: _redeliver`; it is not a script of its own.

The request hash of an at_least_once request holds, besides the common fields: ma (max
attempts), pw (its pickup window, ms), pro (its producer), sq (its sequence number) and att (the
attempts handed out so far; absent while none). `k` names the keys: hash, run (in-flight zset), lease (the
at_least_once in-flight zset), levels, prefix (level prefix) and dead (the three dead-letter
keys); `o` the settings: extra_ttl (request TTL beyond the pickup window, ms), list_ttl,
dead_ttl, dead_cap, pulse (the endpoint's channel) and node_prefix (`prq:node:`).

- requeued: state queued again at the front of its priority level (it waited its turn once),
  with a fresh pickup deadline; the owner, receiver and beats are cleared, so the silent
  receiver is fenced (its beats, answer and cancel are refused); receivers are pulsed
- exhausted (att >= ma): dead-lettered with reason attempts_exhausted, the attempts, priority,
  producer and max attempts (so a replay queues it as it was); the request is cancelled with
  that reason, and its sender and watchers are pulsed
]]
local function redeliver(k, id, now, o)
  local att, ma, pri, pro, body, snd, watchers, pw, bk = unpack(redis.call('HMGET', k.hash,
    'att', 'ma', 'pri', 'pro', 'b', 'snd', 'w', 'pw', 'bk'))
  body = body_rest(k.hash, body, bk)
  att, ma, pw = tonumber(att) or 1, tonumber(ma) or 1, tonumber(pw) or 120000
  redis.call('ZREM', k.run, id)
  redis.call('ZREM', k.lease, id)
  if att < ma and body then
    redis.call('HSET', k.hash, 'st', 'queued', 'pd', now + pw)
    redis.call('HDEL', k.hash, 'own', 'rcv', 'tk', 'hr')
    local ttl = pw + tonumber(o.extra_ttl)
    redis.call('PEXPIRE', k.hash, ttl)
    queue_push_front(k.levels, k.prefix, pri or '0', id, o.list_ttl, now, ttl)
    redis.call('PUBLISH', o.pulse, '')
    return 'queued'
  end
  if body then
    local details = cjson.encode({reason = 'attempts_exhausted', attempts = att, at = now,
      priority = tonumber(pri) or 0, producer = pro or '', max_attempts = ma, pickup_ms = pw})
    dead_letter(k.dead, id, details, body, now, o.dead_ttl, o.dead_cap)
  end
  redis.call('HSET', k.hash, 'st', 'cancelled', 'why', 'attempts_exhausted', 'dn', now)
  drop_body(k.hash, {'own'})
  local msg = 'r|' .. id .. '|'
  if snd then redis.call('PUBLISH', o.node_prefix .. snd, msg) end
  if watchers then
    for node in string.gmatch(watchers, '%S+') do redis.call('PUBLISH', o.node_prefix .. node, msg) end
  end
  return 'cancelled'
end
