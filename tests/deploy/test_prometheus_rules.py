"""deploy/prometheus/alerts.yml: promtool accepts it, its unit tests (alerts_test.yml) pass,
and every metric it and its tests use is one prq exports, with prq's labels.

promtool comes with Debian's `prometheus` package, which `make system-deps` installs (so CI
has it); without it these tests fail saying so, rather than skip.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.exported import SCRAPE_LABELS, exported_series, metric_names, sample_series

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yml"
OPERATIONS = ROOT / "docs" / "operations.md"
#: Bound of one promtool run.
PROMTOOL_TIMEOUT_S = 60
#: The alerts an operator needs (issue 20), by name.
ALERTS = {
    "PrqQueuedWithoutReceiver",
    "PrqOldestRequestTooOld",
    "PrqDataLoss",
    "PrqDeadLettersGrowing",
    "PrqReceiversLost",
    "PrqRedisEvicting",
    "PrqRedisNearMaxmemory",
    "PrqRedisUnreachable",
}
#: A series selector in alerts_test.yml: name{label="value",...}.
SERIES = re.compile(r"^(?P<name>[a-z_:][a-z0-9_:]*)\{(?P<labels>.*)\}$")
#: Label matchers inside a selector's braces, and `by (...)` / `on (...)` groupings.
MATCHER = re.compile(r"\b([a-z_][a-z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """Run promtool (fail, saying how to install it, when it is missing)."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool is not installed: `make system-deps` installs it (Debian package "
            "prometheus; as root: apt-get install prometheus)"
        )
    return subprocess.run(
        [path, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=PROMTOOL_TIMEOUT_S,
        check=False,
    )


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_promtool_accepts_the_rules() -> None:
    # When promtool checks the rules file / Then it finds every alert and no problem
    result = promtool("check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_the_alerts_fire_as_their_unit_tests_say() -> None:
    # When promtool runs alerts_test.yml (series shaped like prq's /metrics)
    result = promtool("test", "rules", RULE_TESTS)

    # Then every case passes: each alert fires when it should, and not when it should not
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_there_and_unit_tested_both_ways() -> None:
    # Given the rules and their unit tests
    names = {rule["alert"] for rule in rules()}
    document = yaml.safe_load(RULE_TESTS.read_text())
    cases = [case for test in document["tests"] for case in test["alert_rule_test"]]

    # Then every alert an operator needs is there, and each one is tested both firing and not
    assert names == ALERTS
    for name in ALERTS:
        outcomes = {bool(case["exp_alerts"]) for case in cases if case["alertname"] == name}
        assert outcomes == {True, False}, f"{name}: tested {outcomes}"


def test_every_alert_has_a_severity_a_summary_and_a_runbook_section() -> None:
    # Given the operations guide's section anchors (GitHub's: a heading, lowercased, dashes)
    headings = re.findall(r"^#{2,4} (.+)$", OPERATIONS.read_text(), flags=re.MULTILINE)
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings}
    for rule in rules():
        # Then every alert has a severity, a summary, a description and a runbook link to a
        # section that exists
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], rule["alert"]
        document, _, anchor = annotations["runbook_url"].partition("#")
        assert document == "docs/operations.md", rule["alert"]
        assert anchor in anchors, f"{rule['alert']}: no section #{anchor} in {OPERATIONS.name}"


def test_the_rules_name_only_metrics_and_labels_prq_exports() -> None:
    exported = exported_series()
    labels = set().union(*exported.values()) | SCRAPE_LABELS
    for rule in rules():
        expr = rule["expr"]
        # Then every metric an alert reads is one prq exports
        assert metric_names(expr), f"{rule['alert']} reads no prq metric"
        assert metric_names(expr) <= set(exported), rule["alert"]
        # ... and every label it matches or groups by is one of prq's (or the scrape's)
        used = set(MATCHER.findall(expr))
        for grouping in GROUPING.findall(expr):
            used |= {label.strip() for label in grouping.split(",") if label.strip()}
        assert used <= labels, f"{rule['alert']}: {used - labels}"


def test_the_unit_tests_input_series_are_shaped_like_prqs() -> None:
    exported = exported_series()
    document = yaml.safe_load(RULE_TESTS.read_text())
    for test in document["tests"]:
        for series in test["input_series"]:
            # Then each input series is a prq series with exactly its labels, plus the
            # labels a scrape adds
            match = SERIES.match(series["series"])
            assert match, series["series"]
            name = match["name"]
            assert name in exported, name
            names = set(re.findall(r"([a-z_]+)=\"", match["labels"]))
            assert names == exported[name] | SCRAPE_LABELS, series["series"]


def test_the_exported_series_agree_with_a_real_scrape() -> None:
    # Given a real scrape of the admin service's /metrics, kept beside the tests
    exported = exported_series()
    for name, label_sets in sample_series().items():
        # Then each of its prq samples is one the registry exports, with the same labels
        assert label_sets == {exported[name]}, name
