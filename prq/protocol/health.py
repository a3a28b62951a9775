"""Is Redis configured the way prq's guarantees need? Judged from INFO.

prq detects data loss by noticing that Redis came back empty or went back in time. Two server
settings defeat that or lose requests silently:
- eviction (`maxmemory-policy` other than `noeviction` with a `maxmemory` limit): Redis drops
  request keys under memory pressure, one at a time, which looks like nothing at all;
- persistence (AOF, or RDB snapshots): a restarted Redis reloads an old state instead of coming
  back empty; prq's counters still catch most rollbacks, but requests that had finished may be
  handed out again, and the time a reload takes is time every call waits.

prq's ACL users may not run CONFIG (CONFIG GET would also reveal passwords), so the judgement
reads INFO, which has no snapshot schedule: RDB persistence shows once a snapshot was taken
(under the default schedule, within an hour of the first write) or when data was loaded from
disk at start. A manual SAVE counts too, rightly: Redis loads that dump.rdb when it restarts.
Callers that may read CONFIG can pass the schedule as `save`. Nodes read INFO at start and at
every data-loss check and log each warning when it first appears; the admin service's health
reports them. Pure functions
over the text Redis returns, so the same judgement serves both facades and the admin service.
"""

from __future__ import annotations

from collections.abc import Mapping

from prq.protocol.effects import Reply

__all__ = ["INFO_CALLS", "parse_info", "redis_persistence", "redis_warnings"]

#: What a node reads at start (each a separate call: `INFO a b` needs Redis 7).
INFO_CALLS = (("INFO", "server"), ("INFO", "memory"), ("INFO", "persistence"))


def parse_info(*replies: Reply | Mapping[str, object]) -> dict[str, str]:
    """Merge INFO replies (raw `key:value` lines, or mappings redis-py parsed) into one."""
    info: dict[str, str] = {}
    for reply in replies:
        if isinstance(reply, Mapping):  # redis-py's client parses INFO itself
            info.update({str(key): str(value) for key, value in reply.items()})
            continue
        if isinstance(reply, bytes):
            text = reply.decode("utf-8", errors="replace")
        elif isinstance(reply, str):
            text = reply
        else:
            continue
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition(":")
            if sep:
                info[key.strip()] = value.strip()
    return info


def redis_persistence(info: Mapping[str, object], save: str | None = None) -> list[str]:
    """The kinds of persistence Redis uses: `aof`, `rdb snapshots`; empty when it keeps none.

    `save` is the `save` setting when CONFIG GET was allowed; without it, signs in INFO stand in
    (snapshots taken since start, keys loaded from disk at start).
    """
    kinds = []
    if str(info.get("aof_enabled", "0")) == "1":
        kinds.append("aof")
    if save is not None:
        snapshots = bool(save.strip())
    else:
        snapshots = (
            _int(info.get("rdb_saves")) > 0 or _int(info.get("rdb_last_load_keys_loaded")) > 0
        )
    if snapshots:
        kinds.append("rdb snapshots")
    return kinds


def redis_warnings(info: Mapping[str, object], save: str | None = None) -> list[str]:
    """Why this Redis would lose requests silently or defeat data-loss detection (empty: fine)."""
    warnings = []
    policy = str(info.get("maxmemory_policy", "noeviction"))
    if policy != "noeviction" and _int(info.get("maxmemory")) > 0:
        warnings.append(
            f"Redis evicts keys under memory pressure (maxmemory-policy {policy}): an evicted "
            "request is lost without any error; set maxmemory-policy noeviction"
        )
    persistence = redis_persistence(info, save)
    if persistence:
        warnings.append(
            f"Redis persists data ({', '.join(persistence)}): after a restart it reloads an old "
            "state instead of coming back empty, so finished requests may be handed out again; "
            'prq wants persistence off (save "", appendonly no)'
        )
    return warnings


def _int(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0
