"""Prometheus rules and the Grafana dashboard use only metrics the services export.

``promtool check rules`` / ``promtool test rules`` run in ``make test``
(deploy/prometheus/prometheus.py); this checks names, offline, against the catalogue.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from graylane.metrics.catalogue import series_names

ROOT = Path(__file__).resolve().parents[2]
RULES = sorted((ROOT / "deploy" / "prometheus" / "rules").glob("*.yml"))
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "graylane.json"
PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning"
# Series Prometheus itself adds to every scrape target.
PROMETHEUS_BUILTIN = frozenset({"up"})

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = frozenset(
    {
        *("sum", "min", "max", "avg", "count", "rate", "irate", "increase", "deriv"),
        *("changes", "histogram_quantile", "and", "or", "unless", "offset", "bool"),
        *("time", "vector", "scalar", "label_values", "abs", "clamp_min", "clamp_max"),
    }
)


def metric_names(expr: str) -> set[str]:
    """Series names a PromQL expression selects (functions, labels and keywords dropped)."""
    text = _GROUPING.sub(" ", _MATCHERS.sub(" ", _STRINGS.sub(" ", expr)))
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range selectors [5m]
    names = set()
    for match in _IDENT.finditer(text):
        word = match.group(0)
        following = text[match.end() :].lstrip()
        if word in _KEYWORDS or following.startswith("("):
            continue
        if re.fullmatch(r"\d+[smhdwy]?", word) or word.startswith("$"):
            continue
        names.add(word)
    return names


def _rules() -> list[dict[str, Any]]:
    return [
        rule for f in RULES for g in yaml.safe_load(f.read_text())["groups"] for rule in g["rules"]
    ]


RECORDED = frozenset(r["record"] for r in _rules() if "record" in r)
KNOWN = series_names() | RECORDED | PROMETHEUS_BUILTIN


def test_metric_names_parser_sees_through_functions_and_labels() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (model, le) (rate(graylane_e2e_latency_seconds_bucket"
        '{model="m",version=~"1.*"}[5m]))) > on (model) group_left () graylane_qos_slo_p99_seconds'
    )
    assert metric_names(expr) == {
        "graylane_e2e_latency_seconds_bucket",
        "graylane_qos_slo_p99_seconds",
    }


@pytest.mark.parametrize("rule", _rules(), ids=lambda r: r.get("record") or r["alert"])
def test_every_rule_reads_known_metrics(rule: dict[str, Any]) -> None:
    used = metric_names(rule["expr"])
    assert used, "a rule selects at least one series"
    assert used <= KNOWN, f"unknown metrics: {sorted(used - KNOWN)}"


def test_the_alerts_the_issue_asks_for_exist() -> None:
    alerts = {r["alert"] for r in _rules() if "alert" in r}
    assert alerts == {
        "GraylaneCandidateLatencyRegression",
        "GraylaneCandidateErrorRegression",
        "GraylaneCandidateTtftRegression",
        "GraylaneCandidateTpotRegression",
        "GraylaneCandidateOutputLengthDrift",
        "GraylaneGenerationQueueSaturated",
        "GraylaneRolloutStuckInHold",
        "GraylaneRoutingTableStale",
        "GraylaneWorkerDown",
        "GraylaneConsumerLagGrowing",
        "GraylaneQosAtFloorAndBreaching",
        "GraylaneShedRateHigh",
        "GraylaneGatewayDown",
        "GraylaneGatewayServerErrors",
        "GraylaneGatewayRateLimitedSustained",
        "GraylaneGatewayOverloaded",
    }
    for rule in _rules():
        if "alert" in rule:
            assert rule["labels"]["severity"] in {"warning", "critical"}
            assert rule["annotations"]["summary"] and rule["for"]


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def _dashboard_exprs() -> list[str]:
    dash = _dashboard()
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in dash["annotations"]["list"]]
    exprs += [v["definition"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return exprs


@pytest.mark.parametrize("expr", _dashboard_exprs())
def test_every_dashboard_expr_reads_known_metrics(expr: str) -> None:
    # label_values(selector, label): only the selector is PromQL.
    used = metric_names(re.sub(r"label_values\((.*),\s*\w+\)", r"\1", expr))
    assert used, f"{expr!r} selects no series"
    assert used <= KNOWN, f"unknown metrics: {sorted(used - KNOWN)}"


def test_dashboard_covers_the_views_the_issue_asks_for() -> None:
    used: set[str] = set()
    for expr in _dashboard_exprs():
        used |= metric_names(expr)
    assert {
        "graylane:e2e_latency_seconds:p50_5m",
        "graylane:e2e_latency_seconds:p99_5m",
        "graylane:router_requests:rate5m",
        "graylane:error_ratio:rate5m",
        "graylane_router_weight_ratio",
        "graylane_worker_active_variant",
        "graylane:worker_consumer_lag_messages:sum",
        "graylane:shed:rate5m",
        "graylane_gpu_utilization_ratio",
        "graylane_gpu_memory_used_bytes",
        "graylane_audit_records_total",
        "graylane:time_to_first_token_seconds:p99_5m",
        "graylane:time_per_output_token_seconds:p99_5m",
        "graylane_qos_slo_ttft_p99_seconds",
        "graylane_qos_slo_tpot_p99_seconds",
        "graylane:generated_tokens:rate5m",
        "graylane:generated_tokens_per_generation:mean5m",
        "graylane:worker_kv_cache_occupancy_ratio:max",
        "graylane:worker_waiting_sequences:mean",
        "graylane:gateway_requests:rate5m",
        "graylane:gateway_rate_limited_ratio:rate5m",
        "graylane:gateway_overloaded_ratio:rate5m",
        "graylane:gateway_server_error_ratio:rate5m",
        "graylane:gateway_latency_seconds:p99_5m",
        "graylane:gateway_ttft_seconds:p99_5m",
        "graylane:gateway_streams_open:sum",
    } <= used
    annotations = _dashboard()["annotations"]["list"]
    assert any("graylane_audit_records_total" in a["expr"] for a in annotations)


def test_dashboard_panels_are_well_formed() -> None:
    dash = _dashboard()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in dash["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"
    cells: dict[tuple[int, int], str] = {}  # no two panels share a grid cell
    for panel in dash["panels"]:
        grid = panel["gridPos"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]
    rows = sorted(p["gridPos"]["y"] for p in dash["panels"] if p["type"] == "row")
    for top, below in itertools.pairwise(rows):
        assert below - top > 1, f"the row at y {top} has no panels under it"
    assert dash["uid"] and {v["name"] for v in dash["templating"]["list"]} >= {
        "datasource",
        "model",
    }


def test_provisioning_points_at_the_dashboard_and_the_datasource_uid() -> None:
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "graylane.yml").read_text())
    assert providers["apiVersion"] == 1
    (provider,) = providers["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].endswith("graylane")
    sources = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())
    (source,) = sources["datasources"]
    variable = next(v for v in _dashboard()["templating"]["list"] if v["name"] == "datasource")
    assert source["type"] == variable["query"] == "prometheus"
    assert source["uid"] == variable["current"]["value"]
