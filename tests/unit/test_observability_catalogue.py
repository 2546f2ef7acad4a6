"""The catalogue of metrics and spans: the generated doc is current, names follow the
Prometheus conventions, and WorkerMetrics builds exactly the catalogue."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pgworker import catalogue as cat
from pgworker import metrics_docs, metrics_questions
from pgworker.metrics import WorkerMetrics
from pgworker.worker.health import HealthState

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "observability.md"


def test_docs_observability_md_is_generated_from_the_catalogue():
    assert DOC.read_text() == metrics_docs.render(), \
        "docs/observability.md is stale: run `python -m pgworker.catalogue > docs/observability.md`"


def test_the_documented_command_prints_the_doc():
    out = subprocess.run([sys.executable, "-m", "pgworker.catalogue"], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    assert out == metrics_docs.render()


def test_every_metric_and_span_is_in_the_doc():
    doc = metrics_docs.render()
    for m in cat.METRICS:
        assert f"`{m.name}`" in doc
    for s in cat.SPANS:
        assert f"`{s.name}`" in doc
    for attribute in cat.SPAN_ATTRIBUTES:
        assert f"`{attribute}`" in doc


def test_names_follow_the_prometheus_conventions():
    names = [m.name for m in cat.METRICS]
    assert len(names) == len(set(names))
    for m in cat.METRICS:
        assert re.fullmatch(r"pgworker_[a-z0-9_]+", m.name), m.name
        assert (m.kind == "counter") == m.name.endswith("_total"), m.name
        assert m.kind in ("counter", "gauge", "histogram")
        assert (m.kind == "histogram") == (m.buckets is not None), m.name
        assert m.source in ("worker", "database", "supervisor", "drain")
        assert m.help.endswith(".") and m.recorded_by, m.name
        if "duration" in m.name or "age" in m.name or "timestamp" in m.name:
            assert m.name.removesuffix("_total").endswith("_seconds"), f"{m.name}: base unit seconds"
        assert not {"job_id", "id", "pid", "worker", "error", "message"} & set(m.labels), m.name
    # gauges a claimer keeps only while it lives
    assert cat.METRICS_BY_NAME["pgworker_jobs_in_flight"].multiprocess_mode == "livesum"
    assert cat.METRICS_BY_NAME["pgworker_claimer_heartbeat_timestamp_seconds"].multiprocess_mode == "livemin"


def test_every_documented_query_uses_catalogued_metrics():
    series = cat.all_series_names()
    for expr in metrics_questions.all_queries():
        used = set(re.findall(r"\bpgworker_[a-z0-9_]+", expr))
        assert used and used <= series, (expr, used - series)


def test_prometheus_client_is_not_imported_before_the_multiprocess_directory_is_set():
    """prometheus_client reads PROMETHEUS_MULTIPROC_DIR when it is imported: the CLI must
    import nothing that imports it before `pgworker run` has set the directory."""
    code = ("import sys, pgworker, pgworker.cli, pgworker.worker, pgworker.worker.claimer, pgworker.tracing; "
            "print(sorted(m for m in sys.modules if m.startswith('prometheus_client')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _families(registry: CollectorRegistry) -> dict:
    """Families of a registry, without the _created series prometheus_client adds outside
    multiprocess mode (PROMETHEUS_DISABLE_CREATED_SERIES=True turns them off)."""
    return {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())
            if not f.name.endswith("_created")}


def test_worker_metrics_build_the_catalogue_and_start_known_series_at_zero():
    registry = CollectorRegistry()
    m = WorkerMetrics(registry)
    m.init_queues(["default", "emails"], {"emails": ["send_email"]})
    fams = _families(registry)
    worker = {d.name.removesuffix("_total") for d in cat.METRICS if d.source == "worker"}
    # the heartbeat gauge exists only once a claimer beats (never a 0 from other processes)
    assert set(fams) == worker - {"pgworker_claimer_heartbeat_timestamp_seconds"}
    value = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fams.values() for s in f.samples}
    for result in cat.CLAIM_RESULTS:
        assert value[("pgworker_claims_total", (("queue", "emails"), ("result", result)))] == 0
    for o in cat.OUTCOMES:
        assert value[("pgworker_jobs_finished_total", (("outcome", o), ("queue", "emails"), ("task", "send_email")))] == 0
    for op in cat.FENCED_OPERATIONS:
        assert value[("pgworker_fenced_writes_total", (("operation", op), ("queue", "default")))] == 0
    for code in cat.KNOWN_ERROR_CODES:
        assert value[("pgworker_jobs_dead_total", (("error_class", code), ("queue", "default")))] == 0
    m.loop_heartbeat()
    assert _families(registry)["pgworker_claimer_heartbeat_timestamp_seconds"].samples[0].value > 0


def test_error_classes_fold_into_other_past_the_top_n():
    m = WorkerMetrics(CollectorRegistry())
    classes = [f"Error{i}" for i in range(cat.ERROR_CLASS_TOP_N + 5)]
    assert [m.error_class(c) for c in classes] == classes[:cat.ERROR_CLASS_TOP_N] + [cat.OTHER] * 5
    assert m.error_class("Error0") == "Error0"  # a class seen before keeps its series
    for code in cat.KNOWN_ERROR_CODES:  # pgworker's own codes never fold
        assert m.error_class(code) == code


def test_events_update_the_right_series():
    registry = CollectorRegistry()
    m = WorkerMetrics(registry)
    m.claimed("q", 2, 0.003, [0.5, 1.5])
    m.finished("q", "t", "retried", 0.2, "Boom")
    m.finished("q", "t", "dead", 0.1, "Boom")
    m.expirations("q", "dead", 3)
    m.in_flight("q", 2)
    m.in_flight("q", -1)
    get = registry.get_sample_value
    assert get("pgworker_claimed_jobs_total", {"queue": "q"}) == 2
    assert get("pgworker_job_wait_duration_seconds_count", {"queue": "q"}) == 2
    assert get("pgworker_job_wait_duration_seconds_sum", {"queue": "q"}) == 2.0
    assert get("pgworker_job_retries_total", {"queue": "q", "error_class": "Boom"}) == 1
    assert get("pgworker_jobs_dead_total", {"queue": "q", "error_class": "Boom"}) == 1
    assert get("pgworker_jobs_dead_total", {"queue": "q", "error_class": "LEASE_EXPIRED"}) == 3
    assert get("pgworker_job_run_duration_seconds_count", {"queue": "q", "task": "t", "outcome": "dead"}) == 1
    assert get("pgworker_jobs_in_flight", {"queue": "q"}) == 1
    quiet = CollectorRegistry()
    WorkerMetrics(quiet, task_label=False).finished("q", "some_task", "succeeded", 0.1)
    assert quiet.get_sample_value("pgworker_jobs_finished_total", {"queue": "q", "task": "", "outcome": "succeeded"}) == 1
    assert "some_task" not in generate_latest(quiet).decode()


def test_readiness_reasons():
    h = HealthState()
    assert h.why_not_ready() == "starting: connecting to PostgreSQL"
    h.connected = h.schema_ok = True
    assert h.why_not_ready() == "LISTEN connection down (reconnecting)"
    h.listening = True
    assert h.ready and h.why_not_ready() is None
    h.listen_required, h.listening = False, False
    assert h.ready
    h.connected, h.reason = False, "database unavailable"
    assert h.why_not_ready() == "database unavailable"
    h.connected, h.reason = True, "shutting down"
    assert h.why_not_ready() == "shutting down"
    assert h.alive  # liveness is the supervision loop, not the database
