"""Batched metric updates record exactly what one update per observation records."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

from pgworker.metrics import WorkerMetrics, observe_many


def _samples(registry: CollectorRegistry, name: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in registry.collect() if fam.name == name for s in fam.samples if not s.name.endswith("_created")}


def test_observe_many_matches_observe_one_by_one():
    values = [0.0, 0.0005, 0.001, 0.0049, 0.005, 0.3, 2.5, 7.0, 1e9, 0.0001]
    one, many = CollectorRegistry(), CollectorRegistry()
    h1 = Histogram("h", "h", ["q"], buckets=(0.001, 0.005, 0.5, 5.0), registry=one).labels("a")
    h2 = Histogram("h", "h", ["q"], buckets=(0.001, 0.005, 0.5, 5.0), registry=many).labels("a")
    for v in values:
        h1.observe(v)
    observe_many(h2, values)
    assert _samples(one, "h") == _samples(many, "h")


def test_finished_many_matches_finished():
    one, many = CollectorRegistry(), CollectorRegistry()
    m1, m2 = WorkerMetrics(one), WorkerMetrics(many)
    runs = [0.01, None, 0.2, 3.0]
    for r in runs:
        m1.finished("q", "t", "retried", r, "BOOM")
    m2.finished_many("q", "t", "retried", runs, "BOOM")
    for name in ("pgworker_jobs_finished", "pgworker_job_run_duration_seconds", "pgworker_job_retries"):
        assert _samples(one, name) and _samples(one, name) == _samples(many, name), name
