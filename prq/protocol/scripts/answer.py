"""The receiver's answer: `apply_response` (store a response as the request's owner, free its
slot, pulse the caller; apply_response.lua), its call builder, reply parser and the layout of
its arguments (which prq.protocol.scripts.merging relies on to merge answers)."""

from __future__ import annotations

from typing import Final

from prq.core.errors import SerializationError
from prq.core.keys import EndpointKeys
from prq.protocol.effects import Call, Reply
from prq.protocol.scripts.loading import APPLY_RESPONSE
from prq.protocol.scripts.replies import as_text

__all__ = [
    "ANSWER_ARGS",
    "ANSWER_HEAD",
    "ANSWER_KEYS",
    "APPLY_OUTCOMES",
    "apply_response_call",
    "parse_apply_response",
]


#: What apply_response can answer (see apply_response.lua).
APPLY_OUTCOMES: Final = frozenset({"ok", "replay", "duplicate", "stale", "fenced", "unknown"})


#: Values per answer in an apply_response call, after its keys and its shared values.
ANSWER_ARGS: Final = 5
ANSWER_KEYS: Final = 5
#: EVALSHA, sha, numkeys, the keys, the five values every answer of a call shares.
ANSWER_HEAD: Final = 3 + ANSWER_KEYS + 5


def apply_response_call(
    keys: EndpointKeys,
    request_id: str,
    owner_token: str,
    response: bytes,
    response_ttl_ms: int,
    now_ms: int,
    pulse_inline_limit_bytes: int,
    unlimited: bool = False,
    waited_ttl_ms: int = 0,
) -> Call:
    """One answer; answers to one endpoint sent together go as one call (merge_answers).
    `unlimited`: the receiver's last take found no max_in_flight limit on the endpoint, so the
    answer need not look for receivers waiting for the slot it frees. `waited_ttl_ms`: the
    shortest an answer that a caller waits for is kept (QueueSettings.waited_response_ttl_s;
    0: just its own TTL)."""
    return APPLY_RESPONSE.call(
        (keys.running, keys.limits, keys.levels, keys.lease, keys.request_prefix),
        (
            keys.node_channel_prefix,
            pulse_inline_limit_bytes,
            keys.pulse_channel,
            0 if unlimited else 1,
            waited_ttl_ms,
            request_id,
            owner_token,
            response,
            response_ttl_ms,
            now_ms,
        ),
    )


def parse_apply_response(reply: Reply) -> str:
    """The status of a one-answer apply_response call."""
    statuses = reply if isinstance(reply, list) else [reply]
    outcome = as_text(statuses[0]) if len(statuses) == 1 else ""
    if outcome not in APPLY_OUTCOMES:
        raise SerializationError(f"unexpected apply_response reply from Redis: {reply!r:.200}")
    return outcome
