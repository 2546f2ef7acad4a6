"""Resource bounds: a worker's memory stays flat while a large backlog drains (bounded
batches, no prefetch), and --max-jobs-per-child / --max-memory-per-child recycle a
claimer without losing or re-running its jobs."""

from __future__ import annotations

import os
import sys

import pytest

from pg import wait_until
from pgcluster import Cluster, missing_tools, require
from worker import Worker, q

pytestmark = pytest.mark.acceptance
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "benchmarks"))


def _recycled(conn, schema, n, w, option):
    wait_until(lambda: q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE state = 'succeeded'")[0][0] == n, 180,
               message=lambda: f"every job with {option}; log:\n{w.logs()[-3000:]}")
    assert w.stop() == 0
    logs = w.logs()
    runs = q(conn, schema, "SELECT job_id, pid FROM {s}.ledger")
    assert len(runs) == n and len({j for j, _ in runs}) == n  # each job ran once
    assert q(conn, schema, "SELECT max(attempts) FROM {s}.jobs") == [(1,)]  # no attempt lost to recycling
    assert "recycling" in logs
    assert "exited with code" not in logs  # a recycle is not a crash: no error, no restart backoff
    return {pid for _, pid in runs}


def test_max_jobs_per_child_recycles_the_claimer_without_losing_jobs(env, pg_dsn, conn):
    schema = env.settings.schema
    n = 200
    env.enqueue_many([("record", i) for i in range(n)])
    with Worker(pg_dsn, schema, "--concurrency", "1", "--max-jobs-per-child", "25", "--batch-size", "5") as w:
        pids = _recycled(conn, schema, n, w, "--max-jobs-per-child")
    assert len(pids) >= n // 25 - 1


def test_max_memory_per_child_recycles_a_leaking_claimer_without_losing_jobs(env, pg_dsn, conn):
    schema = env.settings.schema
    n = 60
    env.enqueue_many([("leak", {"mb": 8}) for _ in range(n)])  # 480 MB if nothing recycled
    with Worker(pg_dsn, schema, "--concurrency", "1", "--batch-size", "2",
                "--max-memory-per-child", str(200 * 1024 * 1024)) as w:
        pids = _recycled(conn, schema, n, w, "--max-memory-per-child")
    assert len(pids) >= 2


def test_memory_stays_flat_while_a_large_backlog_drains(tmp_path, capsys):
    require(missing_tools())
    import backlog_memory

    jobs = int(os.environ.get("PGWORKER_BACKLOG_JOBS", "200000"))
    with Cluster() as cluster:
        report = backlog_memory.measure(cluster.dsn(), "backlog", jobs=jobs, duration=40, concurrency=2,
                                        log_dir=str(tmp_path))
    with capsys.disabled():
        print("\n" + backlog_memory.format_report(report))
    assert report["drained"] > 0
    assert {"dispatcher", "claimer 0", "claimer 1"} <= set(report["processes"])
    for role, p in report["processes"].items():
        # bounded batches: no process grows with the backlog (allocator noise stays well under this)
        assert p["growth_first_to_last_quarter_mb"] < 8, (role, report)
