"""The monitoring objects: the ServiceMonitor's shape and the PrometheusRule's alerts, which
must name exported metrics and documented runbook anchors.
"""

from __future__ import annotations

import re
from typing import Any

from tests.deploy.checks import broken
from tests.deploy.render import REPO


def test_servicemonitor_shape(servicemonitor: dict[str, Any]) -> None:
    spec = servicemonitor["spec"]
    assert set(spec) == {"selector", "endpoints"}
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= {"port", "path", "interval", "scheme", "scrapeTimeout"}
        assert re.fullmatch(r"\d+[smh]", endpoint.get("interval", "30s"))


OPERATIONS_DOC = REPO / "docs" / "operations.md"


def exported_metric_names() -> set[str]:
    """Every metric name fhmon serve exports (keeper configured), as Prometheus sees them."""
    from types import SimpleNamespace

    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from monitor.metrics import CallStats
    from monitor.prom import Metrics
    from monitor.signing import KeyInfo

    stats = CallStats()
    stats.record("open_by_handle_at", "ok", 1e-5)
    keys = SimpleNamespace(key_ids=(1,), describe=lambda: [KeyInfo(1, True)])
    service = SimpleNamespace(stats=stats, targets={}, keys=keys, key_error=None,
                              config=SimpleNamespace(keeper_socket="/run/keeper.sock"))
    text = generate_latest(Metrics(service).registry).decode()  # type: ignore[arg-type]
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def runbook_anchors() -> set[str]:
    """GitHub's anchors of the "### " headings of docs/operations.md."""
    return {re.sub(r"[^a-z0-9 _-]", "", line[4:].strip().lower()).replace(" ", "-")
            for line in OPERATIONS_DOC.read_text().splitlines() if line.startswith("### ")}


def check_rules(rule_object: dict[str, Any], exported: set[str], anchors: set[str]) -> list[str]:
    problems = []
    spec = rule_object["spec"]
    if set(spec) != {"groups"}:
        problems.append(f"PrometheusRule spec keys {sorted(spec)}")
    for group in spec["groups"]:
        for rule in group["rules"]:
            name = rule.get("alert", "?")
            if set(rule) - {"alert", "expr", "for", "labels", "annotations"}:
                problems.append(f"{name}: unknown keys {sorted(set(rule) - {'alert'})}")
            if not re.fullmatch(r"Fhmon[A-Z][A-Za-z]+", name):
                problems.append(f"{name}: alert names are FhmonCamelCase")
            if not re.fullmatch(r"\d+[smh]", str(rule.get("for", ""))):
                problems.append(f"{name}: 'for' is not a duration")
            if rule.get("labels", {}).get("severity") not in {"warning", "critical"}:
                problems.append(f"{name}: severity is warning or critical")
            notes = rule.get("annotations", {})
            if not {"summary", "description", "runbook"} <= set(notes):
                problems.append(f"{name}: needs summary, description and runbook annotations")
            runbook = str(notes.get("runbook", ""))
            if runbook != f"docs/operations.md#{name.lower()}" or name.lower() not in anchors:
                problems.append(f"{name}: no runbook section '### {name}' in docs/operations.md")
            for metric in re.findall(r"\b(?:fhmon|process)_[a-z_]+", str(rule.get("expr", ""))):
                if metric not in exported:
                    problems.append(f"{name}: fhmon exports no metric {metric}")
    return problems


def test_prometheusrule_alerts(prometheusrule: dict[str, Any]) -> None:
    """The alerts the issue asks for, on metrics fhmon really exports, each with a runbook."""
    assert check_rules(prometheusrule, exported_metric_names(), runbook_anchors()) == []
    alerts = {r["alert"] for g in prometheusrule["spec"]["groups"] for r in g["rules"]}
    assert {"FhmonKeyDirUnhealthy", "FhmonMacFailuresRising", "FhmonRegistrationsRefused",
            "FhmonDataPlaneSaturated"} <= alerts


def test_negative_rules(prometheusrule: dict[str, Any]) -> None:
    exported, anchors = exported_metric_names(), runbook_anchors()
    rule = broken(prometheusrule)
    rule["spec"]["groups"][0]["rules"][0]["expr"] = "fhmon_no_such_metric > 0"
    assert any("no metric fhmon_no_such_metric" in p for p in check_rules(rule, exported, anchors))
    rule = broken(prometheusrule)
    rule["spec"]["groups"][0]["rules"][0]["alert"] = "FhmonWithoutRunbook"
    assert any("no runbook section" in p for p in check_rules(rule, exported, anchors))
    rule = broken(prometheusrule)
    del rule["spec"]["groups"][0]["rules"][0]["labels"]
    assert any("severity" in p for p in check_rules(rule, exported, anchors))
