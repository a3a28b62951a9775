"""prq.spark is importable without loading pyspark or pyarrow (both are optional)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.spark


def test_importing_prq_and_prq_spark_loads_neither_pyspark_nor_pyarrow() -> None:
    code = (
        "import sys, prq, prq.spark, prq.bulk\n"
        "loaded = sorted(m for m in ('pyspark', 'pyarrow', 'pandas') if m in sys.modules)\n"
        "print(','.join(loaded))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == ""
