"""The scripts prq runs: each read from its `<name>.lua` (helpers included, unused ones left
out), the catalog of all of them, SCRIPT LOAD for every one, and the SPUBLISH twins a Redis
Cluster runs. The Lua files are package data beside this module (pyproject.toml), read with
importlib.resources."""

from __future__ import annotations

import hashlib
import re
from importlib import resources
from typing import Final

from prq.protocol.effects import Call, Script

__all__ = [
    "ALL_SCRIPTS",
    "APPLY_RESPONSE",
    "BEAT",
    "CANARY",
    "CANCEL",
    "DEAD_LETTER",
    "ENQUEUE",
    "ENQUEUE_MANY",
    "HAND_BACK",
    "PRESENCE",
    "PURGE_DEAD",
    "READ_RESPONSE",
    "REPLAY_DEAD",
    "STAMP",
    "TAKE",
    "UNPARK",
    "WITHDRAW",
    "for_cluster",
    "load_script",
    "script_load_calls",
]

_INCLUDE: Final = re.compile(r"^-- include: (_[a-z_]+)$", re.MULTILINE)
#: A helper file's function: from `local function <name>(` at the start of a line to the first
#: line that is `end` alone (the helpers indent their bodies; tests/unit checks the convention).
_HELPER: Final = re.compile(r"^local function (\w+)\(.*?^end\n", re.MULTILINE | re.DOTALL)
#: Lua comments: a block, or the rest of a line (no string of prq's scripts holds "--").
_COMMENT: Final = re.compile(r"--\[\[.*?\]\]|--[^\n]*", re.DOTALL)
_WORD: Final = re.compile(r"\w+")


def _unused(source: str, helpers: dict[str, str]) -> list[str]:
    """The helper functions (name -> text) of `source` that nothing else in it names (comments
    aside), directly or through another helper it keeps."""
    rest = source
    for chunk in helpers.values():
        rest = rest.replace(chunk, "", 1)
    calls = {
        helper: set(_WORD.findall(_COMMENT.sub("", chunk))) & helpers.keys()
        for helper, chunk in helpers.items()
    }
    kept: set[str] = set()
    todo = set(_WORD.findall(_COMMENT.sub("", rest))) & helpers.keys()
    while todo:
        helper = todo.pop()
        kept.add(helper)
        todo |= calls[helper] - kept
    return [chunk for helper, chunk in helpers.items() if helper not in kept]


def load_script(name: str) -> Script:
    """Read `<name>.lua`; a line `-- include: _lib` is replaced by the text of `_lib.lua`
    (shared helpers, written once), so what Redis runs is one self-contained script. The
    helpers' functions that the script does not call, directly or through another kept
    helper, are left out: Redis builds each `local function` (a closure) on every call."""
    files = resources.files(__package__)
    source = files.joinpath(f"{name}.lua").read_text("utf-8")
    helpers: dict[str, str] = {}

    def include(m: re.Match[str]) -> str:
        text = files.joinpath(f"{m.group(1)}.lua").read_text("utf-8")
        helpers.update((f.group(1), f.group(0)) for f in _HELPER.finditer(text))
        return text

    source = _INCLUDE.sub(include, source)
    for chunk in _unused(source, helpers):
        source = source.replace(chunk, "", 1)
    return Script(name, source, hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest())


ENQUEUE: Final = load_script("enqueue")
TAKE: Final = load_script("take")
APPLY_RESPONSE: Final = load_script("apply_response")
WITHDRAW: Final = load_script("withdraw")
READ_RESPONSE: Final = load_script("read_response")
BEAT: Final = load_script("beat")
CANCEL: Final = load_script("cancel")
CANARY: Final = load_script("canary")
PRESENCE: Final = load_script("presence")
ENQUEUE_MANY: Final = load_script("enqueue_many")
DEAD_LETTER: Final = load_script("dead_letter")
REPLAY_DEAD: Final = load_script("replay_dead")
PURGE_DEAD: Final = load_script("purge_dead")
HAND_BACK: Final = load_script("hand_back")
UNPARK: Final = load_script("unpark")
STAMP: Final = load_script("stamp")
ALL_SCRIPTS: Final = (
    ENQUEUE, TAKE, APPLY_RESPONSE, WITHDRAW, READ_RESPONSE, BEAT, CANCEL, CANARY, PRESENCE,
    ENQUEUE_MANY, DEAD_LETTER, REPLAY_DEAD, PURGE_DEAD, HAND_BACK, UNPARK, STAMP,
)  # fmt: skip


def script_load_calls() -> tuple[Call, ...]:
    """SCRIPT LOAD for every script, for one round trip."""
    return tuple(Call(("SCRIPT", "LOAD", script.source), script) for script in ALL_SCRIPTS)


def _sharded(script: Script) -> Script:
    source = script.source.replace("redis.call('PUBLISH', ", "redis.call('SPUBLISH', ")
    sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()
    return Script(script.name, source, sha)


#: On a Redis Cluster each script publishes with SPUBLISH: every channel it publishes to is a
#: shard channel of its own slot (the endpoint's pulse channel, and its node channels,
#: EndpointKeys.node_channel_prefix), heard by that shard's subscribers only.
SHARDED: Final = {script.sha: _sharded(script) for script in ALL_SCRIPTS}


def for_cluster(call: Call) -> Call:
    """`call` as a cluster runs it: a script call names the script's SPUBLISH twin."""
    twin = SHARDED.get(call.script.sha) if call.script is not None else None
    if twin is None:
        return call
    if call.args[0] == "EVALSHA":
        return Call(("EVALSHA", twin.sha, *call.args[2:]), twin)
    return Call(("SCRIPT", "LOAD", twin.source), twin)
