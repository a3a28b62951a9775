"""The package as a user gets it: `python -m build` makes an sdist and, from the sdist, a wheel;
the wheel is installed into a clean virtual environment and run from a folder outside the
source tree. A file the package needs at run time but the build leaves out (a Lua script, a
dashboard asset) fails these tests, as would a module that only the source tree can import.

Nothing is downloaded: the build runs without isolation (setuptools and build come from the
project's virtual environment), pip installs the wheel alone (`--no-deps --no-index`), and the
clean environment reaches its dependencies through a `.pth` file that appends the project
environment's site-packages as a plain path. A plain path line is not a site directory, so the
`.pth` files inside it (the editable install of prq among them) are not processed: `import
prq` in the clean environment finds the wheel's copy, which the first test asserts.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

import prq
from prq.cli.demo import BENCH_NEEDS_CHECKOUT
from prq.embedded import free_port
from tests.redis_servers import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
#: What the build's copy of the source tree leaves out (caches, environments, earlier builds).
NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    "test-output",
)
#: Bounds a build, an install, and one short command.
BUILD_TIMEOUT_S = 240.0
COMMAND_TIMEOUT_S = 60.0
#: Bounds `prq demo --duration 3`: the embedded server, two node processes, the run, stopping.
DEMO_TIMEOUT_S = 90.0
#: Bounds a long-running command's start (imports, connecting, binding a port) and its stop.
START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Built:
    """What `python -m build` made."""

    sdist: Path
    wheel: Path


@dataclass(frozen=True)
class Installed:
    """A clean virtual environment holding the wheel, and how to run its commands."""

    venv: Path
    python: Path
    prq: Path
    #: A folder outside the source tree to run from.
    cwd: Path
    #: The environment without PYTHONPATH, VIRTUAL_ENV and PRQ_* variables.
    env: dict[str, str]

    def run(
        self, *args: str, timeout_s: float = COMMAND_TIMEOUT_S, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`prq ARGS` from the clean environment (plus `env`), to its end (bounded)."""
        return subprocess.run(
            [str(self.prq), *args],
            cwd=self.cwd,
            env=self.env | (env or {}),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def python_json(self, code: str) -> object:
        """What `code`, run by the clean environment's Python, prints as JSON."""
        done = subprocess.run(
            [str(self.python), "-c", code],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=True,
        )
        return json.loads(done.stdout)


class Started:
    """A long-running `prq` command from the clean environment; its stderr goes to a file."""

    def __init__(self, installed: Installed, args: list[str], env: dict[str, str]) -> None:
        self.args = args
        self.stderr_path = installed.cwd / f"prq-{args[0]}-{len(os.listdir(installed.cwd))}.err"
        with self.stderr_path.open("w") as stderr:
            self.process = subprocess.Popen(
                [str(installed.prq), *args],
                cwd=installed.cwd,
                env=installed.env | env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def wait_for_line(self, text: str) -> None:
        """Until `text` is on stderr (fails after START_TIMEOUT_S, or at once if it exited)."""

        def said() -> bool:
            if self.process.poll() is not None and text not in self.stderr():
                raise AssertionError(f"prq {self.args} exited: {self.stderr()}")
            return text in self.stderr()

        wait_until(said, START_TIMEOUT_S, message=f"{text!r} from prq {self.args}")

    def stop(self) -> int:
        """SIGTERM, then the exit code (fails after START_TIMEOUT_S)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(START_TIMEOUT_S)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


def _clean_env() -> dict[str, str]:
    """This process's environment without what would point a Python at the source tree or
    the project's environment (PYTHONPATH, VIRTUAL_ENV) or configure prq (PRQ_*)."""
    return {
        name: value
        for name, value in os.environ.items()
        if name not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"} and not name.startswith("PRQ_")
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The sdist, and the wheel built from it, of a copy of the source tree (the build writes
    its egg-info and build folders there, not into the tree under test)."""
    source = tmp_path_factory.mktemp("source") / "prq"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    dist = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)],
        cwd=source,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (sdist,) = dist.glob("prq-*.tar.gz")
    (wheel,) = dist.glob("prq-*.whl")
    return Built(sdist=sdist, wheel=wheel)


@pytest.fixture(scope="module")
def installed(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """A clean virtual environment with the wheel installed and the project environment's
    site-packages appended to its path (for the dependencies)."""
    env = _clean_env()
    cwd = tmp_path_factory.mktemp("elsewhere")
    venv = tmp_path_factory.mktemp("clean") / "venv"
    _check([sys.executable, "-m", "venv", "--without-pip", str(venv)], env, cwd)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=True,
    ).stdout.strip()
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (Path(purelib) / "prq_test_dependencies.pth").write_text("".join(f"{p}\n" for p in ours))
    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check"]
    _check([*pip, "install", "--quiet", "--no-deps", "--no-index", str(built.wheel)], env, cwd)
    return Installed(venv=venv, python=python, prq=venv / "bin" / "prq", cwd=cwd, env=env)


def _check(argv: list[str], env: dict[str, str], cwd: Path) -> None:
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
    )
    assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"


@pytest.fixture
def started(installed: Installed) -> Iterator[list[Started]]:
    """Long-running commands of one test, killed at teardown."""
    processes: list[Started] = []
    yield processes
    for process in processes:
        process.kill()


# -- what was built and installed -----------------------------------------------------------------


def test_the_sdist_carries_what_a_build_needs(built: Built) -> None:
    # Given the sdist's files, relative to its top folder
    with tarfile.open(built.sdist) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}

    # Then it has the project's files, every Lua script and every dashboard asset
    assert {"README.md", "LICENSE", "CHANGELOG.md", "pyproject.toml"} <= names
    assert _source_files("prq/protocol/scripts", "*.lua") <= names
    assert _source_files("api/static", "*") <= names


def test_the_clean_environment_imports_the_wheel_not_the_source_tree(
    installed: Installed,
) -> None:
    # When the clean environment imports prq and api
    found = installed.python_json(
        "import importlib.metadata, json, prq, api; "
        "print(json.dumps([prq.__file__, api.__file__, prq.__version__, "
        "importlib.metadata.version('prq')]))"
    )

    # Then both come from its own site-packages, and every version is the source's
    assert isinstance(found, list)
    prq_file, api_file, version, metadata_version = found
    assert Path(prq_file).is_relative_to(installed.venv), prq_file
    assert Path(api_file).is_relative_to(installed.venv), api_file
    assert version == metadata_version == prq.__version__
    # And `prq --version` says it too
    shown = installed.run("--version")
    assert shown.returncode == 0 and shown.stdout == f"prq {prq.__version__}\n", shown


def test_the_package_data_is_installed(installed: Installed) -> None:
    # When the installed copy lists its Lua scripts and dashboard assets as package resources
    found = installed.python_json(
        "import json; from importlib import resources; print(json.dumps("
        "[sorted(p.name for p in resources.files(n).iterdir() if p.is_file()) "
        "for n in ('prq.protocol.scripts', 'api.static')]))"
    )

    # Then they are every script and asset of the source tree
    assert isinstance(found, list)
    scripts, assets = (set(names) for names in found)
    assert {Path(p).name for p in _source_files("prq/protocol/scripts", "*.lua")} <= scripts
    assert {Path(p).name for p in _source_files("api/static", "*")} <= assets


# -- running it -----------------------------------------------------------------------------------


def test_prq_help_runs_from_the_installed_package(installed: Installed) -> None:
    shown = installed.run("--help", env={"COLUMNS": "120"})

    assert shown.returncode == 0, shown.stderr
    for command in ("worker", "call", "stats", "api", "demo", "bench"):
        assert command in shown.stdout


def test_prq_demo_runs_on_the_embedded_server(installed: Installed) -> None:
    # When the installed demo runs for 3 s with no Redis given (it starts its own)
    done = installed.run("demo", "--duration", "3", timeout_s=DEMO_TIMEOUT_S)

    # Then it ends by itself, successfully, having run calls on both nodes
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "embedded redis-server on redis://127.0.0.1:" in done.stdout, output
    assert "handled by node A=" in done.stdout, output


def test_one_call_between_two_processes(
    installed: Installed, started: list[Started], redis_url: str, key_prefix: str
) -> None:
    # Given a receiver process serving an endpoint with the demo's handlers
    env = {"PRQ_REDIS_URL": redis_url, "PRQ_PREFIX": key_prefix}
    endpoint = "poll://packaged-echo"
    worker = Started(installed, ["worker", "prq.demo.handlers:handle", "-e", endpoint], env)
    started.append(worker)
    worker.wait_for_line("prq worker: serving")

    # When a caller process calls it
    called = installed.run("call", endpoint, "echo", '{"from": "the wheel"}', env=env)

    # Then the answer comes back, and the receiver stops cleanly
    assert called.returncode == 0, called.stderr
    assert json.loads(called.stdout) == {"from": "the wheel"}
    assert worker.stop() == 0, worker.stderr()


def test_the_admin_service_serves_the_dashboard_from_the_installed_package(
    installed: Installed, started: list[Started], redis_url: str, key_prefix: str
) -> None:
    # Given the installed admin service
    port = free_port()
    token = "packaged-admin-token-0123456789"
    env = {"PRQ_REDIS_URL": redis_url, "PRQ_PREFIX": key_prefix, "PRQ_API_ADMIN_TOKENS": token}
    service = Started(installed, ["api", "--port", str(port)], env)
    started.append(service)

    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
        wait_until(lambda: _answers(client, "/health"), START_TIMEOUT_S, message="/health")

        # When the dashboard page and an asset are asked for, Then both are served
        page = client.get("/dashboard")
        assert page.status_code == 200, page.text
        assert 'src="/dashboard/static/app.js"' in page.text
        asset = client.get("/dashboard/static/app.js")
        assert asset.status_code == 200 and asset.text.strip()
        # And its JSON routes answer, reading Redis
        listed = client.get("/api/endpoints", headers={"Authorization": f"Bearer {token}"})
        assert listed.status_code == 200, listed.text


def test_prq_bench_says_it_needs_the_source_checkout(installed: Installed) -> None:
    done = installed.run("bench")

    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == BENCH_NEEDS_CHECKOUT
    assert done.stdout == ""


# -- helpers --------------------------------------------------------------------------------------


def _source_files(folder: str, pattern: str) -> set[str]:
    """The source tree's files matching `pattern` in `folder`, relative to the root."""
    found = {p.relative_to(ROOT).as_posix() for p in (ROOT / folder).glob(pattern) if p.is_file()}
    assert found, f"no {pattern} in {folder}"
    return found


def _answers(client: httpx.Client, path: str) -> bool:
    """Whether the service answers `path` at all (it may still be binding its port)."""
    try:
        client.get(path)
    except httpx.TransportError:
        return False
    return True
