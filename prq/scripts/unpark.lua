--[[ unpark: a receiver that shuts down withdraws a take token's park, and learns what was handed
to the token without the receiver collecting it (a hand-off that came as it stopped listening).

KEYS[1]  parked tokens         prq:{e}:parked   (list, oldest first)
KEYS[2]  park details          prq:{e}:parks    (hash: token -> "<node>|<until, server ms>")
KEYS[3]  take receipt          prq:{e}:t:<token>
KEYS[4]  request hash prefix   prq:{e}:r:   (ids are appended; same hash tag, same slot)
ARGV[1]  owner token

Reply: the ids on the token's receipt that it still owns (state taken, owner the token); the
receiver gives each back (hand_back.lua), as it does with what it holds.

Invariants:
- after this step nothing more is handed to the token: its park is gone, in the same step as
  the receipt is read, so no hand-off can slip in between
- read-only for the requests: giving back is hand_back.lua's, with its owner check
]]
if redis.call('HDEL', KEYS[2], ARGV[1]) == 1 then
  redis.call('LREM', KEYS[1], 1, ARGV[1])
end
local owned = {}
for _, id in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  local st, own = unpack(redis.call('HMGET', KEYS[4] .. id, 'st', 'own'))
  if st == 'taken' and own == ARGV[1] then owned[#owned + 1] = id end
end
return owned
