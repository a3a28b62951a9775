"""The series prq exports, as Prometheus stores them: sample name -> label names.

Taken from the metrics prq registers (prq.observe.metrics, prq.ops.exporter), not from a list kept
by hand: the counters and histograms with their label names, and the collectors' gauges and
counters as they come out of a collect with one endpoint and one Redis server. prometheus_client
names a counter's samples `<name>_total` and `<name>_created`, a histogram's `_bucket` (with `le`),
`_sum`, `_count` and `_created`. `metrics_sample.prom` beside this file is a real scrape of the
admin service's /metrics (the admin service, a receiver and a sender in one process, after a few
calls and one request left queued); a test checks it agrees with these.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric

from prq.observe import metrics
from prq.ops import exporter
from prq.ops.answers import EndpointInfo, PriorityDepth, RedisMemory

__all__ = ["SAMPLE", "SCRAPE_LABELS", "exported_series", "metric_names", "sample_series"]

#: The real scrape kept as a fixture.
SAMPLE = Path(__file__).with_name("metrics_sample.prom")
#: Labels Prometheus adds to every scraped series.
SCRAPE_LABELS = frozenset({"job", "instance"})

#: A metric name in PromQL or in a series selector (prq's are all prefixed prq_).
_NAME = re.compile(r"\bprq_[a-z0-9_]+\b")


def _wrapped() -> Iterable[tuple[Metric, list[str]]]:
    """prq's counters and histograms, each with its label names."""
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            (family,) = value.describe()
            # the label names a wrapper was declared with (prometheus_client keeps no public
            # accessor for them; a labelled wrapper exports no sample until a label is used)
            yield family, list(value._labelnames)


def _collected() -> Iterable[Metric]:
    """The collectors' families (what the admin service reads from Redis at each scrape), as
    they come out with one endpoint and one Redis server."""
    endpoint = exporter.EndpointCollector()
    endpoint.update(
        [
            EndpointInfo(
                endpoint="poll://e", depth=1, in_flight=0, oldest_age_s=1.0, receivers=0,
                enqueued_total=1, last_seen_ms=0, max_in_flight=1, max_pending=1,
                priorities=[PriorityDepth(priority=0, depth=1)],
            )
        ]
    )  # fmt: skip
    redis = exporter.RedisCollector()
    redis.update(
        [RedisMemory(node="h:6379", used_memory_bytes=1, maxmemory_bytes=0, evicted_keys=0)]
    )
    return [*endpoint.collect(), *redis.collect()]


def exported_series() -> dict[str, frozenset[str]]:
    """Every sample name prq exports -> its label names (without job and instance)."""
    series: dict[str, frozenset[str]] = {}
    for family, labels in _wrapped():
        names = frozenset(labels)
        if family.type == "counter":
            series[f"{family.name}_total"] = names
            series[f"{family.name}_created"] = names
        else:  # a histogram
            series[f"{family.name}_bucket"] = names | {"le"}
            for suffix in ("_sum", "_count", "_created"):
                series[family.name + suffix] = names
    for family in _collected():
        for sample in family.samples:
            series[sample.name] = frozenset(sample.labels)
    return series


def metric_names(text: str) -> set[str]:
    """The prq metric names a PromQL expression (or any text) names."""
    return set(_NAME.findall(text))


def sample_series() -> dict[str, set[frozenset[str]]]:
    """The real scrape's prq samples: name -> the label-name sets it has."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, set[frozenset[str]]] = {}
    for family in text_string_to_metric_families(SAMPLE.read_text()):
        for sample in family.samples:
            if sample.name.startswith("prq_"):
                found.setdefault(sample.name, set()).add(frozenset(sample.labels))
    return found
