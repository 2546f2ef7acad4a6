"""The short chaos soak (benchmarks/chaos.py): every fault kind at least once against
three real workers, a throwaway PostgreSQL cluster and a TCP proxy, and the invariants
checked at the end. `python benchmarks/chaos.py --help` runs the long one."""

from __future__ import annotations

import os
import sys

import pytest

from pgcluster import missing_tools, require

pytestmark = pytest.mark.acceptance

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "benchmarks"))


@pytest.mark.timeout(900)
def test_short_chaos_soak_keeps_every_invariant(pg_dsn, tmp_path):
    require(missing_tools())
    import chaos

    seed = int(os.environ.get("PGWORKER_CHAOS_SEED", "11"))
    config = chaos.SoakConfig(jobs=1500, faults=14, duration=50, workers=3, concurrency=2, seed=seed,
                              settle_timeout=240, ledger_dsn=pg_dsn, log_dir=str(tmp_path), quiet=True)
    report = chaos.Soak(config).run()
    table = chaos.format_table(report)
    print(table)
    assert report.ok, table
    assert set(report.faults) == set(chaos.FAULT_KINDS), table  # every kind at least once
    assert report.lost == 0 and report.stuck == 0 and report.double_succeeded == 0
    assert report.succeeded + report.dead == report.jobs_expected == 1500
    assert report.metrics["metrics_succeeded"] <= report.succeeded
    assert all(r.get("first_completion_after_seconds") is not None for r in report.restarts), table
