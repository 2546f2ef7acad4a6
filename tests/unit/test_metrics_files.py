"""pgworker.metrics_files: a gone process's counters, histograms and max gauges merged into
the compacted files change no sample of the merged view, and leave no file behind.

The writers are real processes in prometheus_client's multiprocess mode (the library
picks its file-backed values at import, from PROMETHEUS_MULTIPROC_DIR)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from pgworker.metrics_files import exposition_collector, process_gone

pytestmark = pytest.mark.unit

WRITER = textwrap.dedent("""
    import os, sys
    from prometheus_client import Counter, Gauge, Histogram
    k = int(sys.argv[1])
    jobs = Counter("t_jobs", "jobs", ["queue", "outcome"])
    jobs.labels("a", "ok").inc(k)
    jobs.labels("b", "dead").inc(2 * k)
    wait = Histogram("t_wait_seconds", "wait", ["queue"], buckets=(0.1, 1.0, 10.0))
    for v in (0.05 * k, 0.5 * k, 5.0 * k):
        wait.labels("a").observe(v)
    Gauge("t_build_info", "build", ["version"], multiprocess_mode="max").labels("1.0").set(1)
    Gauge("t_in_flight", "live", ["queue"], multiprocess_mode="livesum").labels("a").set(k)
    print(os.getpid())
""")


def write_as_a_process(path, k: int) -> int:
    out = subprocess.run([sys.executable, "-c", WRITER, str(k)], env=dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(path)),
                         capture_output=True, text=True, check=True, timeout=60)
    return int(out.stdout)


def view(path) -> dict:
    """Every sample of the merged view: {(name, sorted labels): value}."""
    collector = MultiProcessCollector(None, path=str(path))
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in collector.collect() for s in m.samples}


def test_merging_gone_processes_changes_no_total_and_leaves_their_files_nowhere(tmp_path):
    pids = [write_as_a_process(tmp_path, k) for k in (1, 2, 3)]
    before = view(tmp_path)
    assert before[("t_jobs_total", (("outcome", "dead"), ("queue", "b")))] == 12
    assert before[("t_wait_seconds_count", (("queue", "a"),))] == 9
    for i, pid in enumerate(pids):
        process_gone(pid, str(tmp_path))
        after = view(tmp_path)
        # live gauges go with their process; every other sample is unchanged
        live = {k for k in before if k[0] == "t_in_flight"}
        assert {k: v for k, v in after.items() if k not in live} == {k: v for k, v in before.items() if k not in live}
        remaining = {f for f in os.listdir(tmp_path) if f.endswith(".db")}
        assert not {f for f in remaining if any(f.endswith(f"_{p}.db") for p in pids[:i + 1])}, remaining
    assert sorted(os.listdir(tmp_path)) == ["counter_compacted.db", "gauge_max_compacted.db",
                                            "histogram_compacted.db"]
    # a later process adds to the compacted totals
    pid = write_as_a_process(tmp_path, 10)
    process_gone(pid, str(tmp_path))
    assert view(tmp_path)[("t_jobs_total", (("outcome", "ok"), ("queue", "a")))] == 16


def test_an_empty_file_of_a_process_that_died_at_once_is_dropped(tmp_path, monkeypatch):
    pid = write_as_a_process(tmp_path, 1)
    (tmp_path / "counter_999999.db").touch()  # created, never sized: it died in that window
    process_gone(999999, str(tmp_path))
    assert not (tmp_path / "counter_999999.db").exists()
    process_gone(pid, str(tmp_path))
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    registry = CollectorRegistry()
    exposition_collector(registry)  # what /metrics serves
    assert registry.get_sample_value("t_jobs_total", {"queue": "a", "outcome": "ok"}) == 1
