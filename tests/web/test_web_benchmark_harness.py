"""The console's page benchmark (benchmarks/web_pages.py) runs end to end at its smallest
size, so it cannot rot. No timing is looked at: on a shared 2-core machine it means nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_page_benchmark_runs_end_to_end(pg_dsn, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PGWORKER_", "OTEL_", "PROMETHEUS_"))}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.web_pages", "--dsn", pg_dsn, "--finished", "300",
                           "--pending", "50", "--dead", "20", "--repeat", "2", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    [result] = tmp_path.glob("web-*.json")
    rows = json.loads(result.read_text())["rows"]
    assert len(rows) >= 15 and all(r["median_ms"] > 0 for r in rows)
    assert "| overview |" in proc.stdout
