"""prq's backoff jitter comes from a generator of its own (prq.core.jitter): a node's background
threads never move the `random` module's shared sequence, which an application, or a
property-based test running beside a node, may have seeded."""

from __future__ import annotations

import ast
import random
from pathlib import Path

from tenacity import RetryCallState, Retrying

from prq.core.jitter import jitter, wait_jittered_exponential
from prq.serve import pace

PACKAGE = Path(pace.__file__).parents[1]  # prq/


def test_jitter_and_the_retry_wait_leave_the_shared_generator_alone() -> None:
    random.seed(7)
    state = random.getstate()
    factors = [jitter() for _ in range(100)]
    wait = wait_jittered_exponential(multiplier=0.05, max=2.0)
    waits = []
    for attempt in range(1, 10):
        retry_state = RetryCallState(Retrying(), None, (), {})
        retry_state.attempt_number = attempt
        waits.append(wait(retry_state))
    backoffs = [pace._backoff_s(n) for n in range(12)]
    assert random.getstate() == state
    assert all(0.0 <= f < 1.0 for f in factors) and len(set(factors)) > 90
    assert all(0.0 <= w <= 2.0 for w in waits)
    assert all(b >= 0.0 for b in backoffs)


def test_no_module_of_the_library_draws_from_the_shared_generator() -> None:
    # (the demo's made-up traffic may: it is an application, not the library)
    assert PACKAGE.name == "prq" and (PACKAGE / "__init__.py").is_file()
    drawing = []
    for path in PACKAGE.rglob("*.py"):
        if "demo" in path.relative_to(PACKAGE).parts or path.name == "jitter.py":
            continue
        tree = ast.parse(path.read_text("utf-8"))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "random"
            ):
                drawing.append(f"{path.name}:{node.lineno}: random.{node.attr}")
    assert drawing == []
