"""relax_collector: the young generation is collected less often in processes that serve, and
`prq worker` does it at start."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import typer

from prq import QueueSettings
from prq.cli.worker_lifecycle import WorkerConfig, run_worker
from prq.serve.collector import FIRST_THRESHOLD, relax_collector


@pytest.fixture(autouse=True)
def kept_threshold() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_the_first_threshold_is_raised_and_the_older_ones_kept() -> None:
    gc.set_threshold(700, 11, 12)
    relax_collector()
    assert gc.get_threshold() == (FIRST_THRESHOLD, 11, 12)


def test_a_higher_threshold_already_set_is_not_lowered() -> None:
    gc.set_threshold(50_000, 10, 10)
    relax_collector()
    assert gc.get_threshold() == (50_000, 10, 10)


def test_a_collector_switched_off_by_threshold_stays_off() -> None:
    gc.set_threshold(0, 10, 10)
    relax_collector()
    assert gc.get_threshold()[0] == 0


def test_prq_worker_relaxes_the_collector_before_it_connects() -> None:
    gc.set_threshold(700, 10, 10)
    config = WorkerConfig(
        url="http://not-redis.invalid/0",  # refused at once: the worker exits with a usage error
        prefix="prq",
        handler_name="tests.unit.test_collector:handler",
        endpoints=("poll://gc",),
        concurrency=1,
        facade="async",
        shutdown_timeout_s=1.0,
        settings=QueueSettings(),
    )
    with pytest.raises((typer.Exit, SystemExit)):
        run_worker(config, handler)
    assert gc.get_threshold()[0] == FIRST_THRESHOLD


def handler(request: object) -> None:
    return None
