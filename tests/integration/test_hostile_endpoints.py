"""Hostile endpoint names: 1,000 distinct names never share a key; invalid names write nothing;
no name reaches a glob command (KEYS, SCAN MATCH, PSUBSCRIBE) or splits a log line."""

from __future__ import annotations

import asyncio
import logging
import time
import unicodedata

import pytest
import redis

from prq import InvalidEndpoint, Request, RequestState, Response
from prq.core.keys import KeySchema
from tests.queue_facades import QueueFactory, run_all, wait_for_state
from tests.queued import queue_depth
from tests.redis_servers import CommandMonitor, async_wait_until, request_keys

pytestmark = pytest.mark.integration

#: Distinct names checked for key collisions, and how many of them get a real request.
NAMES = 1_000
SENT = 50
#: Names that must be refused before anything is written.
INVALID_NAMES = [
    "", "x" * 201, "a\rb", "a\nb", "a\x00b", "tab\there", "zero\u200bwidth", " ", " lead", "trail ",
]  # fmt: skip

#: Seeds full of what could break a key: globs, hash-tag braces, separators, percent escapes
#: (e.g. "%41" must not meet "A", "%7B" must not meet "{"), case, and normalisation forms.
SEEDS = [
    "poll://billing-7", "*", "?", "[abc]", "[^a]", "a*b?c", "\\*", "{", "}", "{}", "}{",
    "{{tag}}", "{a}:{b}", ":", "::", "a:b", "prq:{x}:q", "%", "%%", "%41", "A", "%7B", "%7b",
    "%25", "%2541", "%E9", "a b", "a  b", "|", "r|id|x", "\"'`", "~", "ÿ", "日本語", "🚀",
    "עברית", "Straße", "STRASSE", "ß", "é", "e\u0301", "Å", "\u212b", "ﬁ", "fi",
]  # fmt: skip


def hostile_names() -> list[str]:
    """1,000 distinct valid endpoint names built from SEEDS and their variants."""
    names: dict[str, None] = {}

    def add(name: str) -> None:
        valid = 1 <= len(name) <= 200 and name.isprintable() and name == name.strip()
        if valid and len(names) < NAMES:
            names[name] = None

    for seed in SEEDS:
        for variant in (seed, seed.upper(), seed.lower(), seed.swapcase()):
            add(variant)
            add(unicodedata.normalize("NFC", variant))
            add(unicodedata.normalize("NFD", variant))
    add("x" * 200)
    add("x" * 199 + "y")
    add("{" * 200)
    add("%" * 200)
    add("é" * 200)
    add("e\u0301" * 100)
    i = 0
    while len(names) < NAMES:
        seed = SEEDS[i % len(SEEDS)]
        add(f"{seed}{i}")
        add(f"{i}{seed}{seed}"[:200])
        i += 1
    result = list(names)
    assert len(result) == NAMES and len(set(result)) == NAMES
    return result


def cluster_hash_tag(key: str) -> str:
    """The part of `key` Redis Cluster hashes: between the first `{` and the next `}`."""
    start = key.find("{")
    end = key.find("}", start + 1)
    assert start != -1 and end > start + 1, f"no hash tag in {key!r}"
    return key[start + 1 : end]


def test_hostile_names_include_the_pairs_that_matter() -> None:
    names = set(hostile_names())
    pairs = [("é", "e\u0301"), ("Å", "\u212b"), ("A", "a"), ("%41", "A"), ("%7B", "{")]
    assert all(a in names and b in names for a, b in pairs)
    assert "x" * 200 in names


async def test_1000_hostile_endpoint_names_never_share_a_key(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    # Given 1,000 distinct hostile names
    names = hostile_names()
    schema = KeySchema(key_prefix)

    # When each is mapped to its keys
    mapped = {name: schema.endpoint(name) for name in names}

    # Then no two names share a key or a channel
    for attribute in ("levels", "sequence", "pulse_channel", "tag"):
        assert len({getattr(keys, attribute) for keys in mapped.values()}) == NAMES, attribute
    assert len({keys.request("id-1") for keys in mapped.values()}) == NAMES
    # And every key of a name has exactly one hash tag, the same for all of that name's keys
    for keys in mapped.values():
        own = [keys.levels, keys.sequence, keys.request("id-1"), keys.take_receipt("t")]
        for key in own:
            assert key.count("{") == 1 and key.count("}") == 1, key
            assert not set(key.removeprefix(key_prefix)) & set("*?[]\\ \r\n")
        assert len({cluster_hash_tag(key) for key in own}) == 1
    assert len({cluster_hash_tag(keys.levels) for keys in mapped.values()}) == NAMES

    # When a request is sent to 50 of them (the nastiest first) and they are drained in
    # reverse order
    sent_to = names[:SENT]
    sender, receiver = make_queue(pickup_timeout_s=30), make_queue()
    requests = {name: Request(endpoint=name, method="m", params=name) for name in sent_to}
    calls = []
    for name in sent_to:
        calls.append(asyncio.create_task(sender.queue_and_wait(requests[name])))
        await wait_for_state(sender, requests[name].id, RequestState.QUEUED)
    taken = {}
    for name in reversed(sent_to):
        taken[name] = await receiver.dequeue(name, timeout_s=5)

    # Then each endpoint handed out exactly its own request, and nothing else is left
    for name in sent_to:
        pending = taken[name]
        assert pending is not None, name
        assert (pending.id, pending.request.endpoint) == (requests[name].id, name)
    for name in sent_to:
        # (a SCAN pattern built from one name's tag matches that name's keys only: no globs)
        tag = cluster_hash_tag(mapped[name].levels)
        found = [k.decode() for k in redis_client.scan_iter(match=f"{key_prefix}:{{{tag}}}:*")]
        assert mapped[name].request(requests[name].id) in found
        assert {cluster_hash_tag(key) for key in found} == {tag}
        assert queue_depth(redis_client, mapped[name]) == 0
    for name in sent_to:
        await receiver.apply_response(Response(id=requests[name].id, result=name))
    responses = await run_all((asyncio.wait_for(c, 20) for c in calls), 30)
    assert [r.result for r in responses] == sent_to


@pytest.mark.parametrize("name", INVALID_NAMES, ids=repr)
async def test_an_invalid_endpoint_is_refused_before_anything_is_written(
    make_queue: QueueFactory, redis_client: redis.Redis, key_prefix: str, name: str
) -> None:
    # Given a started node and the keys and channels of its prefix
    queue = make_queue()
    await queue.start()
    keys_before = request_keys(redis_client, key_prefix)
    channels_before = set(redis_client.pubsub_channels(f"{key_prefix}:*"))

    # When the invalid name is used to build a request, call, or dequeue
    with pytest.raises(InvalidEndpoint):
        Request(endpoint=name, method="m")
    with pytest.raises(InvalidEndpoint):
        await asyncio.wait_for(queue.call(name, "m"), 10)
    with pytest.raises(InvalidEndpoint):
        await asyncio.wait_for(queue.dequeue(name, timeout_s=0.1), 10)

    # Then it is refused with InvalidEndpoint (a ValueError), and nothing was written
    assert issubclass(InvalidEndpoint, ValueError)
    assert request_keys(redis_client, key_prefix) == keys_before
    assert set(redis_client.pubsub_channels(f"{key_prefix}:*")) == channels_before


async def test_serve_refuses_an_invalid_endpoint_at_once(make_queue: QueueFactory) -> None:
    # Given a node
    queue = make_queue()

    # When it is asked to serve an invalid endpoint
    started = time.monotonic()
    serving = make_queue.serve(queue, "bad\nname", lambda request: None)
    await async_wait_until(lambda: not serving.running, 5, message="serve returned")

    # Then serve raises InvalidEndpoint at once instead of retrying forever
    with pytest.raises(InvalidEndpoint):
        await serving.stop()
    assert time.monotonic() - started < 5


@pytest.mark.one_server  # MONITOR watches one server
async def test_names_never_reach_a_glob_command_nor_split_a_log_line(
    make_queue: QueueFactory, redis_admin_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given hostile endpoint names, and producers and methods with line breaks in them
    names = hostile_names()[:20]
    caplog.set_level(logging.DEBUG, logger="prq")
    with CommandMonitor(redis_admin_url) as monitor:
        sender, receiver = make_queue(pickup_timeout_s=30), make_queue()
        # When requests go through each name, one with a forged log line in its producer and
        # method, and a request for a name with a line break is refused
        for name in names:
            request = Request(
                endpoint=name,
                method="m\r\nERROR prq: forged line",
                params=name,
                producer="p\nINFO prq: forged",
            )
            call = asyncio.create_task(sender.queue_and_wait(request))
            pending = await receiver.dequeue(name, timeout_s=5)
            assert pending is not None and pending.request.endpoint == name
            await receiver.apply_response(Response(id=pending.id, result="ok"))
            assert (await asyncio.wait_for(call, 10)).result == "ok"
        with pytest.raises(InvalidEndpoint):
            await sender.call("poll://a\r\nERROR prq: forged", "m")

    # Then no KEYS, SCAN or PSUBSCRIBE was sent at all (by a client or a script)
    sent = set(monitor.client) | set(monitor.lua)
    assert not sent & {"KEYS", "SCAN", "PSUBSCRIBE"}, sent
    assert "EVALSHA" in sent  # (the monitor saw the traffic)
    # And every log line prq wrote is one line
    assert caplog.records
    split = [r.getMessage() for r in caplog.records if {"\r", "\n"} & set(r.getMessage())]
    assert split == []
