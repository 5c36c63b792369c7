"""Prometheus Operator objects: generated from deploy/prometheus/rules (one source), scraping
every pod, and the alerts selecting on labels a PodMonitor gives."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from graylane.deploy.prometheus import operator_objects
from tests.unit.k8s_render import merge
from tests.unit.k8s_validate import validate
from tests.unit.test_k8s_manifests import RENDERED

OVERLAYS = ("cpu", "gpu")


def _one(tree: str, kind: str) -> dict[str, Any]:
    (doc,) = [d for d in RENDERED[tree] if d["kind"] == kind]
    return doc


def test_generated_files_are_up_to_date() -> None:
    for path, text in operator_objects.generated().items():
        assert path.read_text() == text, f"{path} is stale: run operator_objects.py write"
    assert operator_objects.main(["check"]) == 0


@pytest.mark.parametrize("tree", OVERLAYS)
def test_the_rendered_rule_object_holds_every_rule_file(tree: str) -> None:
    rule = _one(tree, "PrometheusRule")
    assert rule["spec"]["groups"] == operator_objects.rule_groups()
    names = {g["name"] for g in rule["spec"]["groups"]}
    assert {"graylane-alerts", "graylane-recording"} <= names


@pytest.mark.parametrize("tree", OVERLAYS)
def test_the_pod_monitor_scrapes_every_service_pod(tree: str) -> None:
    monitor = _one(tree, "PodMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    for deploy in (d for d in RENDERED[tree] if d["kind"] == "Deployment"):
        template = deploy["spec"]["template"]
        labels = template["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in selector.items()), deploy["metadata"]["name"]
        ports = {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
        assert endpoint["port"] in ports, deploy["metadata"]["name"]
        assert labels["app.kubernetes.io/component"]


def _worker_down() -> dict[str, Any]:
    (rule,) = [
        r
        for g in operator_objects.rule_groups()
        for r in g["rules"]
        if r.get("alert") == "GraylaneWorkerDown"
    ]
    return rule


def test_worker_down_selects_on_a_label_the_pod_monitor_sets() -> None:
    monitor = _one("cpu", "PodMonitor")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    set_by_monitor = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
    assert set_by_monitor["component"] == [
        "__meta_kubernetes_pod_label_app_kubernetes_io_component"
    ]
    expr = _worker_down()["expr"]
    assert 'component="worker"' in expr
    assert "job=" not in expr  # a PodMonitor's job is "<namespace>/<name>", never graylane-worker


def test_validation_catches_a_misspelt_monitor_field() -> None:
    monitor = _one("cpu", "PodMonitor")
    validate(monitor)
    bad = merge(monitor, {"spec": {"podMetricEndpoints": []}})
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
    rule = _one("cpu", "PrometheusRule")
    with pytest.raises(jsonschema.ValidationError):
        validate(merge(rule, {"spec": {"groups": [{"name": "x", "rules": [{"for": "5m"}]}]}}))
