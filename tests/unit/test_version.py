"""prq's version is written in one place, `prq.__version__`, and every place that shows it reads
it from there: the package's metadata (pyproject.toml's dynamic version), `prq --version` and
the admin service's OpenAPI document. (tests/packaging checks the built wheel's metadata.)"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from typer.testing import CliRunner

import prq
from api.app import create_app
from api.settings import ApiSettings
from prq.cli import app

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
#: A URL nothing listens on: building the app connects to nothing.
NOWHERE = "redis://127.0.0.1:9/0"


def test_the_version_is_a_release_number() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", prq.__version__), prq.__version__


def test_pyproject_reads_the_version_from_prq() -> None:
    # Given pyproject.toml
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))

    # Then it writes no version of its own, and has setuptools read prq.__version__
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    dynamic = project["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "prq._version.__version__"}


def test_prq_version_prints_the_version() -> None:
    result = CliRunner().invoke(app, ["--version"])

    assert result.exit_code == 0, result.output
    assert result.output == f"prq {prq.__version__}\n"


def test_the_openapi_document_states_the_version() -> None:
    # Given the admin app (built, not started: nothing connects)
    settings = ApiSettings(admin_tokens=["a" * 32])
    service = create_app(settings, redis_url=NOWHERE)

    # Then its OpenAPI document carries prq's version
    assert service.openapi()["info"]["version"] == prq.__version__
