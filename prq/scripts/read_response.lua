--[[ read_response: where a request stands, with its response once there is one.

KEYS[1]  request hash          prq:{e}:r:<id>

Reply: {state, response, reason}; state "missing" when nothing is stored under the id.

Invariants:
- reads only; the sender polls with it because pulses can be lost
]]
local st, rsp, why = unpack(redis.call('HMGET', KEYS[1], 'st', 'rsp', 'why'))
if not st then return {'missing', '', ''} end
return {st, rsp or '', why or ''}
