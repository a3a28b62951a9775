"""deploy/grafana/prq.json: a Grafana dashboard (JSON model, schemaVersion 39) whose panels are
well formed and whose queries read only metrics and labels prq exports.

The panel structure is checked with pydantic models of the part of Grafana's model the board
uses: every panel has a type, a title and a place on the 24-column grid, panels do not overlap,
and every panel but a row has targets, each a PromQL expr on the board's Prometheus data-source
variable.
"""

from __future__ import annotations

import json
import re
from itertools import combinations
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tests.deploy.exported import SCRAPE_LABELS, exported_series, metric_names

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "prq.json"
#: The board's data source: its `datasource` variable, of Prometheus data sources.
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
#: Grafana's grid is 24 columns wide.
GRID_COLUMNS = 24
#: Label names in PromQL: matchers inside braces, and groupings.
MATCHER = re.compile(r"\b([a-z_][a-z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
#: What an operator must find on the board (issue 20): the metrics behind each view.
MUST_SHOW = {
    "prq_endpoint_enqueued_total": "request rate",
    "prq_round_trip_seconds_bucket": "round-trip p50/p99",
    "prq_pickup_wait_seconds_bucket": "pickup-wait p50/p99",
    "prq_endpoint_depth": "depth per endpoint",
    "prq_endpoint_oldest_age_seconds": "oldest age per endpoint",
    "prq_endpoint_in_flight": "in flight",
    "prq_endpoint_dead_letters": "dead letters",
    "prq_data_loss_events_total": "data-loss events",
    "prq_endpoint_receivers": "receivers",
}


class Strict(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class GridPos(Strict):
    h: int = Field(ge=1)
    w: int = Field(ge=1, le=GRID_COLUMNS)
    x: int = Field(ge=0, lt=GRID_COLUMNS)
    y: int = Field(ge=0)


class Target(Strict):
    refId: str = Field(min_length=1)
    expr: str = Field(min_length=1)
    datasource: dict[str, str]


class Panel(Strict):
    id: int
    type: str = Field(min_length=1)
    title: str = Field(min_length=1)
    gridPos: GridPos
    targets: list[Target] = []


class Variable(Strict):
    name: str
    type: str


class Templating(Strict):
    list: list[Variable]


class Dashboard(Strict):
    title: str
    uid: str = Field(min_length=1, max_length=40)
    schemaVersion: int = Field(ge=36)
    panels: list[Panel] = Field(min_length=1)
    templating: Templating
    editable: bool
    time: dict[str, str]
    refresh: str | Literal[False]


def dashboard() -> Dashboard:
    return Dashboard.model_validate(json.loads(DASHBOARD.read_text()))


def exprs(board: Dashboard) -> list[str]:
    return [target.expr for panel in board.panels for target in panel.targets]


def test_the_dashboard_is_a_grafana_model_with_a_prometheus_datasource_variable() -> None:
    # When the board is read as Grafana's dashboard model
    board = dashboard()

    # Then it has a Prometheus data-source variable, and every query uses it
    variables = {variable.name: variable for variable in board.templating.list}
    assert variables["datasource"].type == "datasource"
    assert (variables["datasource"].model_extra or {}).get("query") == "prometheus"
    for panel in board.panels:
        if panel.type != "row":
            assert panel.model_extra and panel.model_extra["datasource"] == DATASOURCE, panel.title
        for target in panel.targets:
            assert target.datasource == DATASOURCE, panel.title


def test_every_panel_has_a_place_and_queries() -> None:
    board = dashboard()
    # Then ids are unique, every panel fits the grid and none overlaps another
    assert len({panel.id for panel in board.panels}) == len(board.panels)
    for panel in board.panels:
        assert panel.gridPos.x + panel.gridPos.w <= GRID_COLUMNS, panel.title
    for a, b in combinations(board.panels, 2):
        pa, pb = a.gridPos, b.gridPos
        apart = (
            pa.x + pa.w <= pb.x or pb.x + pb.w <= pa.x or pa.y + pa.h <= pb.y or pb.y + pb.h <= pa.y
        )
        assert apart, f"{a.title!r} overlaps {b.title!r}"
    # ... and every panel but a row has targets, with distinct refIds
    for panel in board.panels:
        if panel.type == "row":
            assert not panel.targets, panel.title
            continue
        assert panel.targets, panel.title
        ref_ids = [target.refId for target in panel.targets]
        assert len(set(ref_ids)) == len(ref_ids), panel.title


def test_every_query_names_only_metrics_and_labels_prq_exports() -> None:
    exported = exported_series()
    labels = set().union(*exported.values()) | SCRAPE_LABELS
    board = dashboard()
    variable_queries = [
        str(variable.model_extra.get("definition", ""))
        for variable in board.templating.list
        if variable.model_extra
    ]
    for expr in [*exprs(board), *variable_queries]:
        if not expr:
            continue
        # Then each query reads prq's metrics, and only those
        names = metric_names(expr)
        assert names, expr
        assert names <= set(exported), f"{expr}: {names - set(exported)}"
        # ... by prq's labels (or the scrape's)
        used = set(MATCHER.findall(expr))
        for grouping in GROUPING.findall(expr):
            used |= {label.strip() for label in grouping.split(",") if label.strip()}
        assert used <= labels, f"{expr}: {used - labels}"
    # And the board shows what an operator needs
    shown = set().union(*(metric_names(expr) for expr in exprs(board)))
    missing = {view for name, view in MUST_SHOW.items() if name not in shown}
    assert not missing, missing
