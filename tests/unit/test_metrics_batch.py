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


def test_metrics_render_while_a_process_file_is_being_created(tmp_path):
    """A claimer's metrics file exists at 0 bytes for a moment after it is created; a scrape
    then failed whole with a 500 (seen once in a full run: test_pod_work_sharing). Real
    prometheus_client in multiprocess mode, in a process of its own (the mode is chosen at
    import)."""
    import subprocess
    import sys

    script = (
        "from prometheus_client import Counter, generate_latest\n"
        "from pgworker.metrics import exposition_registry\n"
        "Counter('probe_total', 'a probe').inc(3)\n"
        "import os; open(os.path.join(os.environ['PROMETHEUS_MULTIPROC_DIR'], 'counter_424242.db'), 'wb').close()\n"
        "print(generate_latest(exposition_registry()).decode())\n")
    proc = subprocess.run([sys.executable, "-c", script], env={**__import__("os").environ,
                          "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "probe_total 3.0" in proc.stdout
