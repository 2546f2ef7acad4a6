"""The benchmark harness runs end to end (its smallest case), so it cannot rot.

Nothing here looks at a speed: timings on a shared 2-core machine mean nothing in a
test. It checks that every section ran without error and wrote its figures, the
Markdown table and the target list.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _strict() -> bool:
    return os.environ.get("PGWORKER_STRICT", "") not in ("", "0", "false", "no")


def test_smallest_benchmark_case_runs_end_to_end(pg_dsn, tmp_path):
    if shutil.which("pgbench") is None and not os.path.exists("/usr/bin/pgbench"):
        message = "pgbench is not installed (Debian: postgresql-client)"
        if _strict():
            pytest.fail(f"{message}; PGWORKER_STRICT=1 requires it", pytrace=False)
        pytest.skip(message)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PGWORKER_", "OTEL_", "PROMETHEUS_"))}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--smallest", "--dsn", pg_dsn,
                           "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    [json_path] = tmp_path.glob("*.json")
    [md_path] = tmp_path.glob("*.md")
    doc = json.loads(json_path.read_text())
    assert doc["errors"] == []
    results = doc["results"]
    for key in ("ceiling c1 b10", "plain c1 b10", "pgworker c1 b10", "pgworker c1 auto",
                "obs off", "obs metrics+sdk", "growth due 200 finished 1000"):
        assert results[key]["jobs_per_second"]["median"] > 0, key
    assert results["pgworker c1 auto"]["rss_claimer_max_mib"]["median"] > 0
    assert results["enqueue single"]["jobs_per_second"]["median"] > 0
    assert results["enqueue_many"]["jobs_per_second"]["median"] > 0
    assert results["insert pgbench plain"]["jobs_per_second"]["median"] > 0
    assert results["latency listen"]["jobs"]["median"] == 10
    assert results["latency poll"]["median_ms"]["median"] > 0
    for key in ("trap none", "trap scheduled", "trap finished", "trap snapshot", "scale 1 pods", "scale 2 pods",
                "insert plain loop", "insert pgbench 100 rows", "enqueue_many 100"):
        assert results[key]["jobs_per_second"]["median"] > 0, key
    assert results["trap snapshot"]["dead_tuples_reclaimed"]["median"] > 0
    assert results["idle fleet"]["statements_per_minute"]["median"] >= 0
    assert {t["target"] for t in doc["targets"]} >= {
        "enqueue, one job per transaction / plain psycopg single-row INSERT loop",
        "enqueue_many, 100 jobs per call / pgbench 100-row INSERT (1 client)"}
    table = md_path.read_text()
    assert "| claimers | batch | pgbench (ceiling) |" in table and "## Targets" in table
    assert "## Traps" in table and "## Scale-out" in table
    assert table.strip() in proc.stdout
