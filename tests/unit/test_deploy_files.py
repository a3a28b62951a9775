"""docker-compose.yml and redis-conf/: parse, point at real commands, keep prq's Redis rules."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.main import get_command

from prq.cli import app

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict[str, object]:
    loaded = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def redis_conf() -> dict[str, str]:
    settings: dict[str, str] = {}
    for line in (ROOT / "redis-conf" / "redis.conf").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition(" ")
            settings[name] = value.strip()
    return settings


def test_every_prq_service_runs_a_real_prq_command() -> None:
    commands = set(get_command(app).commands)  # type: ignore[attr-defined]
    services = compose()["services"]
    assert isinstance(services, dict)
    built = {name: svc for name, svc in services.items() if "build" in svc}
    assert built, "the stack runs at least one prq service"
    for name, service in built.items():
        assert service["command"][0] in commands, (name, service["command"])


def test_redis_service_uses_the_shipped_configuration() -> None:
    redis_service = compose()["services"]["redis"]  # type: ignore[index]
    assert "./redis-conf:/usr/local/etc/redis:ro" in redis_service["volumes"]
    assert redis_service["command"][-1] == "/usr/local/etc/redis/redis.conf"
    assert "healthcheck" in redis_service


def test_redis_conf_keeps_nothing_and_never_evicts() -> None:
    settings = redis_conf()
    assert settings["save"] == '""'
    assert settings["appendonly"] == "no"
    assert settings["maxmemory-policy"] == "noeviction"
    assert settings["aclfile"] == "/usr/local/etc/redis/users.acl"


def test_acl_file_disables_the_default_user_and_confines_prq() -> None:
    lines = (ROOT / "redis-conf" / "users.acl").read_text().splitlines()
    users = {line.split()[1]: line for line in lines if line.startswith("user ")}
    assert " off" in users["default"]
    for name in ("prq", "prq-admin"):
        assert "~prq:*" in users[name] and "resetkeys" in users[name]
        assert "+@all" not in users[name] and "allkeys" not in users[name]


def _has_compose() -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
    return probe.returncode == 0


@pytest.mark.skipif(not _has_compose(), reason="docker compose is not installed here")
def test_docker_compose_accepts_the_file() -> None:
    subprocess.run(
        ["docker", "compose", "-f", str(ROOT / "docker-compose.yml"), "config", "--quiet"],
        check=True,
        timeout=60,
    )
