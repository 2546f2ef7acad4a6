"""Shared pieces of the benchmark: the database, fresh schemas, filling the jobs table,
reading rates from the rows themselves, process memory, and repetition.

Every measurement runs on its own freshly migrated schema (``pgworker_bench_<pid>_<n>``),
dropped afterwards, so no case inherits another's bloat. Rates are read from the rows:
``started_at`` (the claim's ``now()``) and ``finished_at`` (the outcome's ``now()``) are
database timestamps, so process start-up and shutdown are not counted and the clock is
the same for every process.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import psycopg
from psycopg import sql

from pgworker.migrate import drop_schema, migrate

LOCAL_DSN = "postgresql://postgres@127.0.0.1:5432/test"
QUEUE = "bench"
TASK = "noop"
_counter = itertools.count()  # unique schema names within one run


def find_dsn(explicit: str | None) -> str:
    """The DSN to benchmark against: ``--dsn``, else ``PGWORKER_BENCH_DSN``, else
    ``PGWORKER_DSN``, else the local server the tests use (127.0.0.1:5432, database test).

    Raises SystemExit with the fix when no server answers."""
    dsn = explicit or os.environ.get("PGWORKER_BENCH_DSN") or os.environ.get("PGWORKER_DSN") or LOCAL_DSN
    try:
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:  # unreachable, or not a DSN at all
        from pgworker.names import dsn_password, redact, redact_dsn

        raise SystemExit(f"benchmark: cannot connect to {redact_dsn(dsn)!r}: "
                         f"{redact(str(exc).strip(), dsn_password(dsn))}; pass --dsn or set PGWORKER_BENCH_DSN") from None
    return dsn


def connect(dsn: str) -> psycopg.Connection:
    return psycopg.connect(dsn, autocommit=True, application_name="pgworker-bench")


class BenchSchema:
    """A freshly migrated pgworker schema, dropped on exit."""

    def __init__(self, dsn: str, label: str = "b", *, code_root: str | None = None) -> None:
        self.dsn = dsn
        self.name = f"pgworker_bench_{label}_{os.getpid()}_{next(_counter)}"
        self.code_root = code_root  # another checkout: its own migrations (its schema version)

    def __enter__(self) -> "BenchSchema":
        with connect(self.dsn) as conn:
            drop_schema(conn, self.name)
            if self.code_root is None:
                migrate(conn, self.name)
        if self.code_root is not None:
            env = {k: v for k, v in os.environ.items() if not k.startswith("PGWORKER_")}
            env["PYTHONPATH"] = self.code_root
            subprocess.run([sys.executable, "-m", "pgworker.cli", "migrate", "--dsn", self.dsn, "--schema", self.name],
                           env=env, check=True, capture_output=True, cwd=self.code_root)
        return self

    def __exit__(self, *exc: Any) -> None:
        with connect(self.dsn) as conn:
            drop_schema(conn, self.name)

    @property
    def ident(self) -> sql.Identifier:
        return sql.Identifier(self.name)

    def q(self, conn: psycopg.Connection, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Run ``query`` with ``{s}`` standing for the quoted schema."""
        cur = conn.execute(sql.SQL(query).format(s=self.ident), params)
        return cur.fetchall() if cur.description else []

    def fill_later(self, n: int, *, high_priority_share: float = 1 / 3, queue: str = QUEUE, task: str = TASK) -> None:
        """Insert ``n`` pending jobs scheduled an hour from now, a share of them at a
        higher priority than the due jobs (the trap: a priority-first scan walks them)."""
        with connect(self.dsn) as conn:
            step = 200_000
            for start in range(0, n, step):
                k = min(step, n - start)
                self.q(conn, "INSERT INTO {s}.jobs (queue, task, payload, priority, run_at) "
                             "SELECT %s, %s, '{{}}', CASE WHEN g %% 1000 < %s THEN 10 ELSE 0 END, "
                             "now() + interval '1 hour' FROM generate_series(1, %s) AS g",
                       [queue, task, int(1000 * high_priority_share), k])
            self.q(conn, "VACUUM ANALYZE {s}.jobs")

    def dead_tuples(self) -> int:
        """The jobs table's dead row versions (pg_stat_user_tables, after a stats flush)."""
        with connect(self.dsn) as conn:
            conn.execute("SELECT pg_stat_force_next_flush()")
            return self.q(conn, "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = '{s}.jobs'::regclass")[0][0]

    def fill(self, due: int, *, finished: int = 0, queue: str = QUEUE, task: str = TASK) -> None:
        """Insert ``finished`` succeeded jobs (history kept in the table) and ``due``
        pending jobs due now, then VACUUM ANALYZE so every run starts from the same
        planner statistics and visibility map (the same for pgbench and pgworker)."""
        with connect(self.dsn) as conn:
            step = 200_000
            for start in range(0, finished, step):
                n = min(step, finished - start)
                self.q(conn, "INSERT INTO {s}.jobs (queue, task, payload, state, attempts, lease_token, "
                             "started_at, finished_at, run_at, created_at) "
                             "SELECT %s, %s, '{{}}', 'succeeded', 1, 1, now(), now(), now() - interval '1 hour', "
                             "now() - interval '1 hour' FROM generate_series(1, %s)", [queue, task, n])
            for start in range(0, due, step):
                n = min(step, due - start)
                self.q(conn, "INSERT INTO {s}.jobs (queue, task, payload, run_at) "
                             "SELECT %s, %s, '{{}}', now() - interval '1 second' FROM generate_series(1, %s)",
                       [queue, task, n])
            self.q(conn, "VACUUM ANALYZE {s}.jobs")

    def counts(self) -> dict[str, int]:
        with connect(self.dsn) as conn:
            return {state: n for state, n in self.q(conn, "SELECT state::text, count(*) FROM {s}.jobs GROUP BY 1")}

    def max_id(self) -> int:
        with connect(self.dsn) as conn:
            return self.q(conn, "SELECT coalesce(max(id), 0) FROM {s}.jobs")[0][0]

    def window(self, since_id: int = 0) -> tuple[int, float]:
        """(jobs finished, seconds from the first claim to the last outcome) of jobs with
        id > ``since_id`` that succeeded (database timestamps)."""
        with connect(self.dsn) as conn:
            n, span = self.q(conn, "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at))::float8 "
                                   "FROM {s}.jobs WHERE state = 'succeeded' AND id > %s", [since_id])[0]
        return n, span or 0.0


def wal_lsn(dsn: str) -> int:
    """The server's current WAL insert position in bytes (pg_current_wal_insert_lsn). The
    difference over a run is all the WAL the server wrote meanwhile: measure on a quiet
    server."""
    with connect(dsn) as conn:
        return int(conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()[0])


def _server_pids() -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as f:
                    if f.read().strip() in ("postgres", "postmaster"):
                        out.append(int(entry))
            except OSError:
                continue
    return out


class ServerCpu:
    """CPU seconds the local PostgreSQL server spent over a run: every server process
    (/proc, a local server only) sampled with :meth:`sample` while the run goes, each
    counted from when it was first seen to its last sample (a backend of the run starts
    at zero, and one that exits keeps its last sample)."""

    def __init__(self) -> None:
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self._started = False
        self.sample()
        self._started = True

    def sample(self) -> None:
        for pid in _server_pids():
            c = cpu_seconds(pid)
            # a process already there at the start counts from its CPU then; a new one from 0
            self.first.setdefault(pid, 0.0 if self._started else c)
            self.last[pid] = c

    @property
    def seconds(self) -> float:
        return sum(self.last[p] - self.first.get(p, 0.0) for p in self.last)


def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else 0.0


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (VmRSS from /proc), 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process in seconds (/proc/<pid>/stat), 0 when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    except (OSError, ValueError, IndexError):
        return 0.0


def machine_busy_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    total = sum(values[:8])
    return (total - idle) / CLOCK_TICKS, total / CLOCK_TICKS


def children(pid: int) -> list[int]:
    """Direct child processes of ``pid`` (from /proc/<n>/stat)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            if int(stat[stat.rfind(")") + 2:].split()[1]) == pid:
                out.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return sorted(out)


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (0-100) by linear interpolation; 0.0 for no values."""
    if not values:
        return 0.0
    v = sorted(values)
    k = (len(v) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


@dataclass
class Repeated:
    """The median of a few repetitions, with every value kept for the JSON."""

    values: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else 0.0


def repeat(times: int, measure: Callable[[], float]) -> Repeated:
    return Repeated([measure() for _ in range(times)])


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"benchmark: timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def chunks(seq: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(seq), size):
        yield seq[i:i + size]
