"""grafana/pgworker-dashboard.json: provisioning conventions, every expression parsed by
promtool, every metric and label in the catalogue, the panels operators need."""

from __future__ import annotations

import json

import pytest

from deploytools import (DASHBOARD, catalogue_errors, promtool_check_expressions, selectors,
                         substitute_grafana_variables)

pytestmark = pytest.mark.deploy

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out += panel.get("panels", [])  # collapsed rows
    return out


def _expressions() -> dict[str, str]:
    """'panel title / refId' -> PromQL, Grafana variables substituted."""
    return {f"{p['title']} / {t['refId']}": substitute_grafana_variables(t["expr"])
            for p in _panels(_dashboard()) for t in p.get("targets", [])}


def test_fixed_uid_and_no_inputs():
    d = _dashboard()
    assert d["uid"] == "pgworker-overview"
    assert "__inputs" not in d and "__requires" not in d
    assert d.get("id") is None
    assert d["title"] == "pgworker"


def test_datasource_variable():
    variables = {v["name"]: v for v in _dashboard()["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"


def test_queue_variable():
    variables = {v["name"]: v for v in _dashboard()["templating"]["list"]}
    q = variables["queue"]
    assert q["type"] == "query"
    assert q["datasource"] == DATASOURCE
    query = q["query"]["query"] if isinstance(q["query"], dict) else q["query"]
    assert query == "label_values(pgworker_queue_jobs, queue)" == q["definition"]
    assert q["multi"] is True and q["includeAll"] is True


def test_every_panel_and_target_uses_the_datasource_variable():
    for panel in _panels(_dashboard()):
        assert panel.get("datasource") == DATASOURCE, panel["title"]
        for target in panel.get("targets", []):
            assert target.get("datasource") == DATASOURCE, f"{panel['title']} / {target['refId']}"


def test_panel_ids_unique_and_placed():
    panels = _panels(_dashboard())
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]


def test_every_expression_parses_with_promtool(tmp_path):
    exprs = _expressions()
    assert exprs
    result = promtool_check_expressions(exprs, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout


def test_expression_check_catches_bad_promql(tmp_path):
    result = promtool_check_expressions({"bad": "sum by (queue (pgworker_queue_jobs)"}, tmp_path)
    assert result.returncode != 0


def test_every_metric_and_label_is_in_the_catalogue():
    errors = {name: catalogue_errors(expr) for name, expr in _expressions().items()}
    assert not {k: v for k, v in errors.items() if v}


def test_queue_filter_on_queue_labelled_metrics():
    """Selectors of metrics that carry a queue label honour the $queue variable."""
    from pgworker import catalogue as cat

    series = {n: m for m in cat.METRICS for n in cat.exposed_names(m)}
    for panel in _panels(_dashboard()):
        for target in panel.get("targets", []):
            for name, labels in selectors(substitute_grafana_variables(target["expr"])):
                if "queue" in series[name].labels:
                    assert "queue" in labels and '$queue' in target["expr"], f"{panel['title']}: {name}"


#: What the dashboard must show: panel title -> metrics it must use.
REQUIRED_PANELS = {
    "Jobs by state": {"pgworker_queue_jobs"},
    "Oldest due job age": {"pgworker_queue_oldest_job_age_seconds"},
    "Throughput by outcome": {"pgworker_jobs_finished_total"},
    "Enqueue-to-start latency": {"pgworker_job_wait_duration_seconds_bucket"},
    "Run duration": {"pgworker_job_run_duration_seconds_bucket"},
    "Lease renewals": {"pgworker_lease_renewals_total"},
    "Lease expirations": {"pgworker_lease_expirations_total"},
    "Fenced writes": {"pgworker_fenced_writes_total"},
    "Retries by error class": {"pgworker_job_retries_total"},
    "Dead jobs by error class": {"pgworker_jobs_dead_total"},
    "Jobs in flight": {"pgworker_jobs_in_flight"},
    "Dispatcher wake-ups": {"pgworker_dispatcher_wakeups_total"},
    "Statistics query": {"pgworker_queue_stats_up"},
    "Statistics query duration": {"pgworker_queue_stats_duration_seconds"},
    "Since the last drain run": {"pgworker_drain_last_run_timestamp_seconds"},
    "Drain run duration": {"pgworker_drain_duration_seconds"},
    "Drain jobs processed": {"pgworker_drain_jobs_processed"},
    "Drain jobs left": {"pgworker_drain_jobs_left"},
    "Dead and live rows": {"pgworker_table_dead_tuples", "pgworker_table_live_tuples"},
    "Since the last vacuum": {"pgworker_table_last_vacuum_age_seconds"},
    "Vacuum horizon": {"pgworker_table_horizon_age_seconds"},
    "Horizon lag": {"pgworker_table_horizon_lag_transactions"},
    "Jobs table size": {"pgworker_table_size_bytes"},
    "Table statistics query": {"pgworker_table_stats_up"},
    "Since each loop's last pass": {"pgworker_loop_last_success_timestamp_seconds"},
    "Since each claimer loop went round": {"pgworker_claimer_loop_last_success_timestamp_seconds"},
}


def test_table_health_panels_sit_in_their_row():
    """The jobs table's panels come after a row of their own, and the horizon panel's
    legend names the holder (the alert's labels)."""
    panels = _dashboard()["panels"]
    [row] = [i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == "Jobs table health"]
    after = [p["title"] for p in panels[row + 1:]]
    assert {"Dead and live rows", "Since the last vacuum", "Vacuum horizon", "Horizon lag", "Jobs table size",
            "Table statistics query"} <= set(after)
    [horizon] = [p for p in panels if p["title"] == "Vacuum horizon"]
    legend = horizon["targets"][0]["legendFormat"]
    assert "{{holder_name}}" in legend and "{{holder_state}}" in legend


def test_required_panels():
    panels = {p["title"]: p for p in _panels(_dashboard())}
    for title, metrics in REQUIRED_PANELS.items():
        assert title in panels, f"missing panel {title!r}"
        used = {name for t in panels[title]["targets"] for name, _ in selectors(substitute_grafana_variables(t["expr"]))}
        assert metrics <= used, f"{title}: uses {sorted(used)}, needs {sorted(metrics)}"


def test_percentile_panels_show_several_quantiles():
    panels = {p["title"]: p for p in _panels(_dashboard())}
    for title in ("Enqueue-to-start latency", "Run duration"):
        exprs = [t["expr"] for t in panels[title]["targets"]]
        assert {e.split(",")[0] for e in exprs} == {"histogram_quantile(0.5", "histogram_quantile(0.9",
                                                    "histogram_quantile(0.99"}
