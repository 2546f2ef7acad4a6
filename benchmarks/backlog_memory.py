"""Worker memory under a large backlog: is it flat while a million jobs drain?

    python benchmarks/backlog_memory.py --jobs 1000000 --duration 300

Makes a throwaway PostgreSQL cluster (never the shared server), inserts ``--jobs`` no-op
jobs in one statement, runs `pgworker run --concurrency N` against it and samples the
resident set size (RSS, /proc/<pid>/statm) of the dispatcher and of each claimer every
half second while the backlog drains, for ``--duration`` seconds or until it is empty.
Claims are bounded batches (at most ``--max-batch-size`` jobs, never a prefetch of the
backlog), so RSS should stay flat: the report gives each process's RSS after warm-up,
its peak, and the growth between the first and the last quarter of the samples.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

import psycopg  # noqa: E402

from pgcluster import Cluster  # noqa: E402
from worker import ACCEPTANCE_APP, Worker  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")
MB = 1024 * 1024


def rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return None


def measure(dsn: str, schema: str, *, jobs: int, duration: float, concurrency: int = 2,
            warmup: float = 5.0, log_dir: str | None = None) -> dict:
    from pgworker import App

    app = App(dsn, schema=schema)
    app.migrate()
    app.close()
    t = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f'INSERT INTO "{schema}".jobs (queue, task, payload) '
                  "SELECT 'default', 'noop', to_jsonb(g) FROM generate_series(1, %s) AS g", [jobs])
        c.execute(f'ANALYZE "{schema}".jobs')
    insert_seconds = time.monotonic() - t
    samples: dict[str, list[tuple[float, int]]] = {}
    with Worker(dsn, schema, "--concurrency", str(concurrency), "--no-tracing", log_dir=log_dir,
                app=ACCEPTANCE_APP, name="backlog") as w:
        start = time.monotonic()
        roles: dict[int, str] = {}
        left = jobs
        with psycopg.connect(dsn, autocommit=True) as c:
            while time.monotonic() - start < duration:
                now = time.monotonic() - start
                pids = {w.pid: "dispatcher"}
                for pid in w.claimer_pids():
                    roles.setdefault(pid, f"claimer {len([r for r in roles.values() if r.startswith('claimer')])}")
                    pids[pid] = roles[pid]
                for pid, role in pids.items():
                    rss = rss_bytes(pid)
                    if rss is not None:
                        samples.setdefault(role, []).append((now, rss))
                if int(now * 2) % 10 == 0:
                    left = c.execute(f'SELECT count(*) FROM "{schema}".jobs WHERE state = \'pending\'').fetchone()[0]
                    if left == 0:
                        break
                time.sleep(0.5)
            elapsed = time.monotonic() - start
            left = c.execute(f'SELECT count(*) FROM "{schema}".jobs WHERE state <> \'succeeded\'').fetchone()[0]
        assert w.stop(timeout=120) == 0, w.logs()[-3000:]
    done = jobs - left
    report = {"jobs": jobs, "insert_seconds": round(insert_seconds, 1), "drained": done,
              "seconds": round(elapsed, 1), "jobs_per_second": round(done / elapsed, 1), "processes": {}}
    for role, pts in samples.items():
        pts = [(t, r) for t, r in pts if t >= warmup] or pts
        q = max(1, len(pts) // 4)
        first, last = [r for _, r in pts[:q]], [r for _, r in pts[-q:]]
        report["processes"][role] = {
            "samples": len(pts), "rss_after_warmup_mb": round(first[0] / MB, 1),
            "rss_peak_mb": round(max(r for _, r in pts) / MB, 1),
            "growth_first_to_last_quarter_mb": round((max(last) - max(first)) / MB, 2)}
    return report


def format_report(r: dict) -> str:
    lines = [f"backlog {r['jobs']} jobs (inserted in {r['insert_seconds']} s); drained {r['drained']} in "
             f"{r['seconds']} s ({r['jobs_per_second']} jobs/s)", "",
             "| process | RSS after warm-up (MB) | peak (MB) | growth, first to last quarter (MB) | samples |",
             "|---|---|---|---|---|"]
    for role, p in sorted(r["processes"].items()):
        lines.append(f"| {role} | {p['rss_after_warmup_mb']} | {p['rss_peak_mb']} | "
                     f"{p['growth_first_to_last_quarter_mb']} | {p['samples']} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=1_000_000)
    p.add_argument("--duration", type=float, default=300.0, help="seconds of draining to sample")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--json")
    a = p.parse_args()
    with Cluster(settings={"shared_buffers": "256MB"}) as cluster:
        report = measure(cluster.dsn(), "backlog", jobs=a.jobs, duration=a.duration, concurrency=a.concurrency)
    print(format_report(report))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
