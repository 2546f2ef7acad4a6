"""grafana/alerts.yaml through promtool (check and unit tests), against the metric
catalogue, and against the runbook anchors of docs/deploy.md."""

from __future__ import annotations

import pytest
import yaml

from deploytools import (ALERTS, DOCS, PROMTOOL_TESTS, catalogue_errors, doc_anchors, one, promtool, run,
                         scenario_documents)

pytestmark = pytest.mark.deploy


def _rules() -> list[dict]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def _alerts() -> list[dict]:
    return [r for r in _rules() if "alert" in r]


def test_promtool_check_rules():
    result = run([promtool(), "check", "rules", str(ALERTS)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in result.stdout


def test_promtool_unit_tests():
    tests = sorted(PROMTOOL_TESTS.glob("*_test.yaml"))
    assert tests
    result = run([promtool(), "test", "rules", *map(str, tests)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_fires_and_stays_silent_in_unit_tests():
    fires, silent = set(), set()
    for path in PROMTOOL_TESTS.glob("*_test.yaml"):
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fires if check.get("exp_alerts") else silent).add(check["alertname"])
    names = {a["alert"] for a in _alerts()}
    assert names - fires == set(), f"no unit test makes these fire: {sorted(names - fires)}"
    assert names - silent == set(), f"no unit test keeps these silent: {sorted(names - silent)}"


@pytest.mark.parametrize("alert", _alerts(), ids=lambda a: a["alert"])
def test_alert_annotations_and_runbook(alert):
    annotations = alert.get("annotations", {})
    assert {"summary", "description", "runbook_url"} <= set(annotations)
    assert alert["labels"]["severity"] in ("info", "warning", "critical")
    url = annotations["runbook_url"]
    page, _, anchor = url.partition("#")
    assert page.endswith("/docs/deploy.md") and anchor == alert["alert"].lower(), url
    assert anchor in doc_anchors(DOCS.read_text()), f"docs/deploy.md has no section #{anchor}"


@pytest.mark.parametrize("rule", _rules(), ids=lambda r: r.get("alert") or r.get("record"))
def test_rule_metrics_are_in_the_catalogue(rule):
    assert not catalogue_errors(rule["expr"])


@pytest.mark.parametrize("scenario", ["all", "cronjob"])
def test_rendered_prometheusrule_passes_promtool(scenario, tmp_path):
    rule = one(scenario_documents(scenario), "PrometheusRule")
    path = tmp_path / f"{scenario}.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    result = run([promtool(), "check", "rules", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_catalogue_check_catches_unknown_names():
    assert catalogue_errors("rate(pgworker_jobs_total[5m])")
    assert catalogue_errors('pgworker_queue_jobs{status="dead"}')
    assert catalogue_errors("sum by (queu) (pgworker_queue_jobs)")
    assert catalogue_errors('pgworker_queue_jobs{state="pending"}')  # pending is due, scheduled or blocked
    assert not catalogue_errors('pgworker_queue_jobs{state="due"} + pgworker_queue_jobs{state=~"sched.*"}')
    assert catalogue_errors("pgworker_job_run_duration_seconds")  # a histogram has no bare series
    assert not catalogue_errors("histogram_quantile(0.9, sum by (le) (rate(pgworker_job_run_duration_seconds_bucket[5m])))")


def test_docs_internal_links_resolve():
    import re

    text = DOCS.read_text()
    anchors = doc_anchors(text)
    broken = sorted({a for a in re.findall(r"\]\(#([^)]+)\)", text) if a not in anchors})
    assert not broken, f"docs/deploy.md links to missing sections: {broken}"
