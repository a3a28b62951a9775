"""docker-compose.yml, the Dockerfile and redis-conf/: they parse, every command they run is a
real `prq` command with real options, and Redis is configured the way prq needs.

The ACL is checked here against the source (every command prq's Lua scripts and Python code
send must be granted, and nothing else); tests/integration/test_acl.py checks it against a
running Redis.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.main import get_command
from typer.testing import CliRunner

from prq.cli import app
from prq.cli.options import DEFAULT_PREFIX
from prq.transport.topology import locate

ROOT = Path(__file__).resolve().parents[2]
PRQ_SERVICES = ("api", "worker", "demo")


def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def services() -> dict[str, dict[str, Any]]:
    found = compose()["services"]
    assert isinstance(found, dict)
    return found


def prq_commands() -> list[tuple[str, list[str]]]:
    """(where, argv after `prq`) of every prq command the stack runs, health checks included."""
    found: list[tuple[str, list[str]]] = []
    for name, service in services().items():
        if "build" in service:
            found.append((f"{name}.command", [str(arg) for arg in service["command"]]))
        test = service.get("healthcheck", {}).get("test", [])
        if test[:2] == ["CMD", "prq"]:
            found.append((f"{name}.healthcheck", [str(arg) for arg in test[2:]]))
    return found


# -- docker-compose.yml ---------------------------------------------------------------------------


#: The services `--profile sentinel` adds.
SENTINEL_SERVICES = ("redis-replica", "sentinel-1", "sentinel-2", "sentinel-3")
#: The services `--profile cluster` adds: six nodes and the one-off that forms the cluster.
CLUSTER_NODES = tuple(f"cluster-{n}" for n in range(1, 7))
CLUSTER_SERVICES = (*CLUSTER_NODES, "cluster-init")


def test_the_stack_has_redis_the_admin_service_a_worker_and_the_demo() -> None:
    stack = services()
    default = {name for name, service in stack.items() if not service.get("profiles")}
    assert default == {"redis", *PRQ_SERVICES}
    assert set(stack) - default == {*SENTINEL_SERVICES, *CLUSTER_SERVICES}
    for name in PRQ_SERVICES:
        assert stack[name]["build"] == "."
        assert stack[name]["depends_on"], name
    for name, service in stack.items():
        if name == "cluster-init":  # a one-off: it exits once the cluster is formed
            continue
        assert {"test", "interval", "timeout", "retries"} <= set(service["healthcheck"]), name


def test_every_prq_service_runs_a_real_prq_command_with_real_options() -> None:
    group = get_command(app)
    subcommands: dict[str, Any] = group.commands  # type: ignore[attr-defined]
    commands = prq_commands()
    assert {where for where, _ in commands} >= {f"{name}.command" for name in PRQ_SERVICES}
    for where, argv in commands:
        name, *args = argv
        command = subcommands.get(name)
        assert command is not None, f"{where}: prq has no command {name!r}"
        # Parsed (and converted) as `prq` would: an unknown option, a bad value or a missing
        # argument raises here.
        try:
            command.make_context(name, list(args))
        except Exception as exc:  # typer's (vendored) click usage errors
            message = exc.format_message() if hasattr(exc, "format_message") else repr(exc)
            pytest.fail(f"{where}: prq {' '.join(argv)}: {message}")
        # And the command line with --help on the end is accepted by the real entry point.
        result = CliRunner().invoke(app, [*argv, "--help"])
        assert result.exit_code == 0, f"{where}: {result.output}"


def test_the_services_share_redis_as_the_application_user() -> None:
    stack = services()
    for name in PRQ_SERVICES:
        url = stack[name]["environment"]["PRQ_REDIS_URL"]
        # (PRQ_REDIS_URL from the host's environment wins: the sentinel profile's URL)
        assert url.startswith("${PRQ_REDIS_URL:-redis://prq:"), (name, url)
        assert url.endswith("@redis:6379/0}"), (name, url)
    api = stack["api"]
    assert api["command"][:3] == ["api", "--host", "0.0.0.0"]
    assert api["environment"]["PRQ_API_ADMIN_TOKENS"].startswith("${PRQ_API_ADMIN_TOKENS:-")
    assert "/health" in " ".join(api["healthcheck"]["test"])
    assert stack["worker"]["command"][1].startswith("prq.demo.handlers:")


def test_the_worker_serves_its_metrics_to_the_network() -> None:
    # A Prometheus on the compose network scrapes worker:9100/metrics (the default host,
    # 127.0.0.1, would be unreachable from outside the container).
    worker = services()["worker"]
    subcommands: dict[str, Any] = get_command(app).commands  # type: ignore[attr-defined]
    args = [str(arg) for arg in worker["command"][1:]]
    params = subcommands["worker"].make_context("worker", args).params
    assert (params["metrics_port"], params["metrics_host"]) == (9100, "0.0.0.0")
    assert "9100" in [str(port) for port in worker.get("expose", [])]
    header = (ROOT / "docker-compose.yml").read_text().split("services:")[0]
    assert "worker:9100/metrics" in header and "api:8080/metrics" in header


def test_redis_service_uses_the_shipped_configuration() -> None:
    redis_service = services()["redis"]
    assert redis_service["image"].startswith("redis:7")
    assert "./redis-conf:/usr/local/etc/redis:ro" in redis_service["volumes"]
    assert redis_service["command"][-1] == "/usr/local/etc/redis/redis.conf"
    # The health check logs in as the application user, so a broken ACL file shows.
    assert "--user" in redis_service["healthcheck"]["test"]


def test_the_sentinel_profile_watches_redis_and_its_replica_as_the_shipped_users() -> None:
    stack, users = services(), acl_users()
    replica = [str(arg) for arg in stack["redis-replica"]["command"]]
    assert replica[:2] == ["redis-server", "/usr/local/etc/redis/redis.conf"]

    def after(option: str, count: int = 1) -> list[str]:
        at = replica.index(option)
        return replica[at + 1 : at + 1 + count]

    assert after("--replicaof", 2) == ["redis", "6379"]
    assert after("--masteruser") == ["prq-replica"]
    assert f">{after('--masterauth')[0]}" in users["prq-replica"]
    sentinel = {}
    for line in (ROOT / "redis-conf" / "sentinel.conf").read_text().splitlines():
        if line.startswith("sentinel "):
            words = line.split()
            sentinel[words[1]] = words[2:]
    assert sentinel["monitor"] == ["prq", "redis", "6379", "2"]
    assert sentinel["auth-user"] == ["prq", "prq-sentinel"]
    assert f">{sentinel['auth-pass'][1]}" in users["prq-sentinel"]
    for name in SENTINEL_SERVICES[1:]:
        service = stack[name]
        assert service["profiles"] == ["sentinel"] and "sentinel.conf" in service["command"][-1]
        assert {"test", "interval", "timeout", "retries"} <= set(service["healthcheck"]), name
    # And the URL the file's header gives the prq services names those sentinels and that primary
    header = (ROOT / "docker-compose.yml").read_text().split("services:")[0]
    url = re.search(r"PRQ_REDIS_URL=(redis\+sentinel://\S+)", header)
    assert url is not None
    where = locate(url.group(1))
    assert where.master == "prq" and {host for host, _ in where.sentinels} == {
        "sentinel-1", "sentinel-2", "sentinel-3"
    }  # fmt: skip


def test_the_cluster_profile_forms_six_nodes_as_the_shipped_users() -> None:
    stack, users = services(), acl_users()
    admin = acl_users(ROOT / "redis-conf" / "cluster-admin.acl")
    # The nodes: the shipped redis.conf and users plus the cluster's admin, in cluster mode,
    # replicas logging in as prq-replica
    for name in CLUSTER_NODES:
        node = stack[name]
        assert node["profiles"] == ["cluster"] and node["image"].startswith("redis:7")
        script = node["command"][-1]
        assert "users.acl /usr/local/etc/redis/cluster-admin.acl > /data/users.acl" in script
        args = script.split("exec ", 1)[1].split()
        assert args[:2] == ["redis-server", "/usr/local/etc/redis/redis.conf"]
        assert args[args.index("--aclfile") + 1] == "/data/users.acl"
        assert args[args.index("--cluster-enabled") + 1] == "yes"
        assert args[args.index("--masteruser") + 1] == "prq-replica"
        assert f">{args[args.index('--masterauth') + 1]}" in users["prq-replica"]
        assert "prq" in " ".join(node["healthcheck"]["test"])
    # The admin user forms clusters and reads no key, no channel
    rules = admin["prq-cluster-admin"]
    assert set(admin) == {"prq-cluster-admin"} and "resetkeys" in rules and "-@all" in rules
    assert not any(r[0] in "~%&" or r in ("+@all", "allkeys", "allchannels") for r in rules)
    init = stack["cluster-init"]
    assert init["profiles"] == ["cluster"]
    assert set(init["depends_on"]) == set(CLUSTER_NODES)
    command = init["command"][-1]
    assert "--user prq-cluster-admin" in command and "--cluster-replicas 1" in command
    assert f">{command.split('--pass ')[1].split()[0]}" in rules
    # And the URL the file's header gives the prq services names the cluster as the app user
    header = (ROOT / "docker-compose.yml").read_text().split("services:")[0]
    url = re.search(r"PRQ_REDIS_URL=(redis\+cluster://\S+)", header)
    assert url is not None
    where = locate(url.group(1))
    assert where.username == "prq" and f">{where.password}" in users["prq"]
    assert {host for host, _ in where.cluster_nodes} <= set(CLUSTER_NODES)


def test_the_image_installs_the_admin_service_and_runs_prq() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install '.[api]'" in dockerfile
    assert 'ENTRYPOINT ["prq"]' in dockerfile
    assert re.search(r"^USER (?!root)", dockerfile, re.MULTILINE), "the image runs as a user"


def _compose_tool() -> list[str] | None:
    """`docker compose` (v2), else `docker-compose` (v1); None when neither works here."""
    candidates: list[list[str]] = []
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    if shutil.which("docker-compose"):
        candidates.append(["docker-compose"])
    for tool in candidates:
        probe = subprocess.run([*tool, "version"], capture_output=True, check=False, timeout=60)
        if probe.returncode == 0:
            return tool
    return None


def test_docker_compose_accepts_the_file() -> None:
    tool = _compose_tool()
    if tool is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed here")
    result = subprocess.run(
        [*tool, "-f", str(ROOT / "docker-compose.yml"), "config", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


# -- redis.conf -----------------------------------------------------------------------------------


def redis_conf() -> dict[str, list[str]]:
    """Every setting's values (a setting may repeat, e.g. client-output-buffer-limit)."""
    settings: dict[str, list[str]] = {}
    for line in (ROOT / "redis-conf" / "redis.conf").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition(" ")
            settings.setdefault(name, []).append(value.strip())
    return settings


def size_bytes(text: str) -> int:
    """A Redis memory size (`128mb`, `1gb`, `4096`) in bytes."""
    found = re.fullmatch(r"(\d+)(b|k|kb|m|mb|g|gb)?", text.lower())
    assert found, text
    factor = {"k": 1000, "kb": 1024, "m": 1000**2, "mb": 1024**2, "g": 1000**3, "gb": 1024**3}
    return int(found.group(1)) * factor.get(found.group(2) or "", 1)


def test_redis_conf_keeps_nothing_and_never_evicts() -> None:
    settings = redis_conf()
    assert settings["save"] == ['""']
    assert settings["appendonly"] == ["no"]
    assert settings["maxmemory-policy"] == ["noeviction"]
    assert settings["aclfile"] == ["/usr/local/etc/redis/users.acl"]


def test_redis_conf_bounds_what_one_client_can_make_redis_hold() -> None:
    settings = redis_conf()
    largest_body = 64 * 1024**2  # prq's DEFAULT_MAX_BODY_BYTES
    (bulk,) = settings["proto-max-bulk-len"]
    assert largest_body < size_bytes(bulk) <= 512 * 1024**2
    (query,) = settings["client-query-buffer-limit"]
    assert size_bytes(bulk) <= size_bytes(query) <= 1024**3
    limits = {
        value.split()[0]: value.split()[1:] for value in settings["client-output-buffer-limit"]
    }
    assert set(limits) == {"normal", "replica", "pubsub"}
    for klass, (hard, soft, seconds) in limits.items():
        assert 0 < size_bytes(soft) <= size_bytes(hard) <= 1024**3, klass
        assert int(seconds) > 0, klass


# -- users.acl ------------------------------------------------------------------------------------

#: Commands a client sends to connect (redis-py: HELLO with AUTH; SELECT for a /db other than 0;
#: CLIENT SETINFO naming the library), to keep a pub/sub connection alive (PING), and on a
#: Redis Cluster to read its layout and command table (CLUSTER SLOTS, COMMAND).
CONNECTING = {"auth", "hello", "select", "client|setinfo", "ping", "cluster|slots", "command"}
#: Commands with subcommands: the ACL names them as `command|subcommand`.
CONTAINERS = {"acl", "client", "config", "function", "memory", "object", "script"}
#: redis-py client methods that are no Redis command.
NOT_COMMANDS = {"pipeline", "execute", "execute_command", "aclose", "close"}


def acl_users(path: Path | None = None) -> dict[str, list[str]]:
    users: dict[str, list[str]] = {}
    for line in (path or ROOT / "redis-conf" / "users.acl").read_text().splitlines():
        assert not line.startswith("#"), "Redis refuses comments in an ACL file"
        if line.strip():
            kind, name, *rules = line.split()
            assert kind == "user", line
            users[name] = rules
    return users


def granted(rules: list[str]) -> set[str]:
    return {rule[1:].lower() for rule in rules if rule.startswith("+") and "@" not in rule}


def _command_name(words: list[str]) -> str:
    name = words[0].lower()
    if name in CONTAINERS and len(words) > 1 and words[1].isupper():
        return f"{name}|{words[1].lower()}"
    return name


def commands_in(path: Path) -> set[str]:
    """Redis commands a source file sends: redis.call('X') in Lua; ("X", ...) tuples,
    send_command("X") / execute_command("X") and redis-py client methods in Python."""
    text = path.read_text()
    if path.suffix == ".lua":
        return {c.lower() for c in re.findall(r"redis\.p?call\(\s*'([A-Za-z]+)'", text)}
    found = set()
    # A tuple of arguments: Call(("GET", key)), (("INFO", "server"), ("INFO", "memory")).
    tuples = re.findall(r'[(,]\s*\(\s*"([A-Z]{3,})"(?:\s*,\s*"([A-Za-z]+)")?', text)
    for first, second in tuples:
        found.add(_command_name([first, second] if second else [first]))
    for first in re.findall(r'(?:send|execute)_command\(\s*"([A-Z]+)"', text):
        found.add(first.lower())
    # A command named by a choice (pulses: SUBSCRIBE, or SSUBSCRIBE on a cluster), and Lua
    # written from Python (scripts.loading.for_cluster's twins publish with SPUBLISH).
    for choice in re.findall(r'command = "([A-Z]+)" if .* else "([A-Z]+)"', text):
        found.update(word.lower() for word in choice)
    found.update(c.lower() for c in re.findall(r"redis\.p?call\('([A-Z]+)'", text))
    for method in re.findall(r"\b(?:pipe|self\.client)\.([a-z_]+)\(", text):
        if method not in NOT_COMMANDS:
            found.add(method.replace("config_get", "config|get"))
    return found


def commands_of(*paths: Path) -> dict[str, set[str]]:
    """Command -> the files that send it."""
    sent: dict[str, set[str]] = {}
    for path in paths:
        for command in commands_in(path):
            sent.setdefault(command, set()).add(str(path.relative_to(ROOT)))
    return sent


def library_files() -> list[Path]:
    package = ROOT / "prq"
    # (prq.embedded.cluster forms a local cluster as the nodes' own default user, not as prq)
    files = [*package.rglob("*.py"), *package.rglob("*.lua")]
    assert any(f.suffix == ".lua" for f in files), "the Lua steps were not found"
    return sorted(f for f in files if f.relative_to(package).as_posix() != "embedded/cluster.py")


def test_acl_file_disables_the_default_user_and_confines_prq() -> None:
    users = acl_users()
    assert set(users) == {"default", "prq", "prq-admin", "prq-replica", "prq-sentinel"}
    assert "off" in users["default"] and "-@all" in users["default"]
    # The replica's and the sentinels' users reach no key, and grant only their protocols
    for name in ("prq-replica", "prq-sentinel"):
        rules = users[name]
        assert rules[0] == "on" and "resetkeys" in rules and "-@all" in rules, name
        assert not any(r[0] in "~%" or r in ("+@all", "allkeys") for r in rules), name
    assert granted(users["prq-replica"]) == {"psync", "replconf", "ping"}
    assert {"eval", "evalsha", "set", "get", "flushall", "keys"}.isdisjoint(
        granted(users["prq-sentinel"])
    )
    for name in ("prq", "prq-admin"):
        rules = users[name]
        assert rules[0] == "on" and "resetkeys" in rules and "resetchannels" in rules, name
        assert "-@all" in rules and not any(r in rules for r in ("+@all", "allkeys", "~*")), name
        assert not any(r in ("nopass", "allchannels", "&*") for r in rules), name
    # Patterns of the default key prefix; redis.conf tells operators of another to change them.
    assert DEFAULT_PREFIX == "prq"
    assert [r for r in users["prq"] if r[0] in "~%&"] == ["~prq:*", "&prq:*"]
    assert [r for r in users["prq-admin"] if r[0] in "~%&"] == ["%R~prq:*"]
    conf = " ".join((ROOT / "redis-conf" / "redis.conf").read_text().split())
    assert "assume prq's default key prefix `prq`" in conf and "PRQ_PREFIX" in conf


def test_the_app_user_is_granted_exactly_the_commands_prq_sends() -> None:
    # Every command the library sends (its Lua scripts' commands included: Redis checks them
    # too), and the admin service's Inspector, which runs as this user in docker-compose.yml.
    sent = commands_of(*library_files())
    allowed = granted(acl_users()["prq"])
    missing = {command: files for command, files in sent.items() if command not in allowed}
    assert not missing, f"prq sends commands users.acl refuses to user prq: {missing}"
    unused = allowed - set(sent) - CONNECTING
    assert not unused, f"users.acl grants user prq commands prq never sends: {sorted(unused)}"
    assert not {"flushall", "flushdb", "keys", "scan", "debug", "eval", "config|get"} & allowed


def test_the_admin_user_is_granted_exactly_the_reads_of_the_inspector() -> None:
    # prq.protocol.levels: the Inspector lists levels and queued ids through its flows
    package = ROOT / "prq"
    inspector = sorted((package / "ops").glob("*.py"))
    sent = commands_of(
        *inspector, package / "protocol" / "health.py", package / "protocol" / "levels.py"
    )
    allowed = granted(acl_users()["prq-admin"])
    missing = {command: files for command, files in sent.items() if command not in allowed}
    assert not missing, f"the Inspector sends commands users.acl refuses to prq-admin: {missing}"
    unused = allowed - set(sent) - CONNECTING
    assert not unused, f"users.acl grants prq-admin commands it never sends: {sorted(unused)}"
    writes = {"set", "del", "hset", "hdel", "rpush", "lpop", "zadd", "zrem", "evalsha", "publish"}
    assert not writes & allowed
