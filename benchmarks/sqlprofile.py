"""The SQL side of a drain, from pg_stat_statements, on a throwaway cluster.

    python -m benchmarks.sqlprofile [--jobs 100000] [--claimers 4]

pg_stat_statements needs ``shared_preload_libraries``, which a shared server's
configuration must not be changed for; so this makes its own cluster (initdb, as the
``postgres`` user through runuser when run as root), starts it on a free port with the
library preloaded (planning tracked too) and the server defaults otherwise
(synchronous_commit on), drains
``--jobs`` no-op jobs with ``pgworker run --drain`` (metrics on, tracing SDK) and then
with pgbench running the same two statements, and prints per statement: calls, rows per
call, mean and total execution time, the calls planned and their planning time. The cluster is stopped and deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks import ceiling  # noqa: E402
from benchmarks.common import BenchSchema, connect  # noqa: E402
from benchmarks.drain_runs import Observability, drain  # noqa: E402


def _bindir() -> str:
    initdb = shutil.which("initdb") or next(
        (p for p in sorted(os.listdir("/usr/lib/postgresql"), reverse=True)
         if os.path.exists(f"/usr/lib/postgresql/{p}/bin/initdb")), None)
    if initdb is None:
        raise SystemExit("sqlprofile: initdb not found (Debian: apt-get install postgresql)")
    return os.path.dirname(initdb) if os.path.isabs(initdb) else f"/usr/lib/postgresql/{initdb}/bin"


class Cluster:
    """A throwaway PostgreSQL with pg_stat_statements preloaded."""

    def __init__(self) -> None:
        self.bindir = _bindir()
        self.data = tempfile.mkdtemp(prefix="pgworker-sqlprofile-")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.prefix:
            shutil.chown(self.data, "postgres", "postgres")
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def __enter__(self) -> "Cluster":
        subprocess.run(self.prefix + [f"{self.bindir}/initdb", "-D", self.data, "-U", "postgres", "--auth=trust",
                                      "-E", "UTF8"], check=True, capture_output=True)
        subprocess.run(self.prefix + [f"{self.bindir}/pg_ctl", "-D", self.data, "-w", "-l", f"{self.data}/log",
                                      "-o", f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 "
                                            "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all "
                                            "-c pg_stat_statements.track_planning=on "
                                            "-c max_connections=50",
                                      "start"], check=True, capture_output=True)
        with connect(self.dsn) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(self.prefix + [f"{self.bindir}/pg_ctl", "-D", self.data, "-m", "fast", "stop"],
                       capture_output=True)
        shutil.rmtree(self.data, ignore_errors=True)


def top(dsn: str, limit: int = 6) -> list[tuple[str, int, float, float, float, int, float]]:
    with connect(dsn) as conn:
        rows = conn.execute(
            "SELECT regexp_replace(left(query, 400), '\\s+', ' ', 'g'), calls, rows::float8 / greatest(calls, 1), "
            "mean_exec_time, total_exec_time, plans, total_plan_time FROM pg_stat_statements "
            "WHERE query NOT ILIKE '%%pg_stat_statements%%' "
            # the fills, migrations and schema drops are set-up, not the drain
            "AND query !~* '^\\s*(insert|vacuum|create|drop|alter|comment|with ins|select pg_advisory|select count)' "
            "ORDER BY total_exec_time + total_plan_time DESC LIMIT %s", [limit]).fetchall()
    return rows


def _label(query: str) -> str:
    q = query.lower()
    for needle, name in (("claim up to", "job_claim"), ("candidate as", "job_claim"),
                         ("bench_claim", "job_claim (pgbench, via PL/pgSQL)"),
                         ("record successes", "job_complete"), ("set state = 'succeeded'", "job_complete"),
                         ("extend live leases", "job_renew"), ("set lease_expires_at", "job_renew"),
                         ("set_config", "set_config"), ("begin", "BEGIN"), ("commit", "COMMIT")):
        if needle in q:
            return name
    return query[:60]


def report(title: str, rows: list[tuple[str, int, float, float, float, int, float]], jobs: int,
           seconds: float) -> None:
    print(f"\n### {title}: {jobs:,} jobs in {seconds:.2f} s ({jobs / seconds:,.0f} jobs/s)\n")
    # plans: the calls that were planned (a prepared statement on a cached generic plan is
    # not); planning time is not in the execution time
    print("| statement | calls | rows/call | mean ms | total ms | µs per job | plans | planning ms | "
          "planning µs per job |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for q, calls, rpc, mean, total, plans, plan_ms in rows:
        print(f"| {_label(q)} | {calls:,} | {rpc:.1f} | {mean:.3f} | {total:,.0f} | {1000 * total / jobs:.1f} | "
              f"{plans:,} | {plan_ms:,.0f} | {1000 * plan_ms / jobs:.1f} |")


def compare(other: str, jobs: int, claimers: int, repeat: int) -> None:
    """Drains of ``other`` (a checkout) and of this code, interleaved on one cluster."""
    with Cluster() as cluster:
        for r in range(repeat):
            for label, root in ((f"{other}", os.path.abspath(other)), ("this checkout", None)):
                with BenchSchema(cluster.dsn, "sqlprof", code_root=root) as s:
                    s.fill(jobs)
                    with connect(cluster.dsn) as conn:
                        conn.execute("SELECT pg_stat_statements_reset()")
                    d = drain(s, concurrency=claimers, obs=Observability("sdk"), code_root=root)
                    report(f"round {r + 1}, {label}: pgworker run --drain, {claimers} claimers, defaults",
                           top(cluster.dsn), d.jobs, d.seconds)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--claimers", type=int, default=4)
    p.add_argument("--compare-with", metavar="CHECKOUT",
                   help="another commit's checkout: drains of it and of this one, interleaved "
                        "(--repeat rounds), and no pgbench")
    p.add_argument("--repeat", type=int, default=1)
    a = p.parse_args()
    if a.compare_with:
        compare(a.compare_with, a.jobs, a.claimers, a.repeat)
        return
    with Cluster() as cluster:
        with connect(cluster.dsn) as conn:
            conn.execute("SELECT pg_stat_statements_reset()")
        with BenchSchema(cluster.dsn, "sqlprof") as s:
            s.fill(a.jobs)
            with connect(cluster.dsn) as conn:
                conn.execute("SELECT pg_stat_statements_reset()")
            r = drain(s, concurrency=a.claimers, obs=Observability("sdk"))
            report(f"pgworker run --drain, {a.claimers} claimers, defaults", top(cluster.dsn), r.jobs, r.seconds)
        with connect(cluster.dsn) as conn:
            conn.execute("SELECT pg_stat_statements_reset()")
        t0 = time.monotonic()
        c = ceiling.claim_ceiling(cluster.dsn, batch=100, clients=a.claimers, jobs=a.jobs)
        report(f"pgbench, {a.claimers} clients, batch 100 (its warm-up included)", top(cluster.dsn),
               a.jobs, a.jobs / c["jobs_per_second"] if c["jobs_per_second"] else time.monotonic() - t0)


if __name__ == "__main__":
    main()
