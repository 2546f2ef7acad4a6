"""The server's cost of one run, counted on the run's own backends.

The PostgreSQL primary is the part of a deployment that does not scale out, so the
benchmark reports what each job costs it: CPU seconds of the backends that served the
run (from /proc, so a local server only) and WAL bytes (``pg_current_wal_insert_lsn``
before and after). CPU is counted on the run's backends alone, not the whole server, so
another session on a shared machine does not inflate it: a client process's TCP sockets
are matched to ``pg_stat_activity.client_port``. (Background work the run causes later,
autovacuum above all, is not counted; neither is the WAL writer's CPU. WAL is
cluster-wide: measure on a quiet server, and read the WAL figure of a loaded run with
care.)

Two ways, for two kinds of client:

- :func:`own_backend_cpu`: a client that can run code reads its own backend's CPU at
  the start and the end, with the connection still open (exact);
- :class:`BackendCpu`: for a process the harness does not control (``pgworker run``,
  pgbench), samples the backends of that process tree while it runs; a backend that
  exits between two samples loses at most one sampling interval of CPU.
"""

from __future__ import annotations

import os
from typing import Iterable

import psycopg

from .common import children, connect, cpu_seconds


def own_backend_cpu(conn: psycopg.Connection) -> float:
    """CPU seconds the backend of ``conn`` has used so far (local server only; 0 if unknown)."""
    pid = getattr(conn, "_bench_backend_pid", None)
    if pid is None:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        conn._bench_backend_pid = pid  # type: ignore[attr-defined]
    return cpu_seconds(pid)


def _socket_inodes(pid: int) -> set[int]:
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                out.add(int(target[8:-1]))
    except OSError:
        pass
    return out


def _tcp_ports_by_inode() -> dict[int, int]:
    """{socket inode: local TCP port} of every TCP socket of the machine (IPv4 and IPv6)."""
    out = {}
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    out[int(fields[9])] = int(fields[1].rsplit(":", 1)[1], 16)
        except (OSError, StopIteration, ValueError, IndexError):
            continue
    return out


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children(p))
    return out


def client_ports(pids: Iterable[int]) -> set[int]:
    """The local TCP ports of the sockets the processes hold (their connections' client ports)."""
    inodes: set[int] = set()
    for p in pids:
        inodes |= _socket_inodes(p)
    if not inodes:
        return set()
    return {port for inode, port in _tcp_ports_by_inode().items() if inode in inodes}


class BackendCpu:
    """CPU seconds of the backends serving a process tree, sampled while it runs.

    ``sample()`` finds the tree's connections (their client ports), their backends in
    ``pg_stat_activity`` and each backend's CPU. A backend already there at the first
    sample counts from its CPU then; one first seen later counts from zero (its whole
    life served the run). Needs a TCP connection to a local server; with none matched,
    ``seconds`` stays 0 and ``matched`` False."""

    def __init__(self, dsn: str, root_pid: int, *, refresh_every: int = 10) -> None:
        self.root = root_pid
        self.conn = connect(dsn)
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.backends: set[int] = set()
        self.refresh_every = refresh_every  # samples between two look-ups of the tree's sessions
        self._samples = 0
        self._started = False
        self.sample()
        self._started = True

    def _refresh(self) -> None:
        ports = client_ports(process_tree(self.root))
        if ports:
            rows = self.conn.execute("SELECT pid FROM pg_stat_activity WHERE client_port = ANY(%s)",
                                     [list(ports)]).fetchall()
            self.backends |= {pid for (pid,) in rows}

    def sample(self) -> None:
        if self._samples % self.refresh_every == 0 or not self.backends:
            self._refresh()
        self._samples += 1
        for pid in self.backends:
            c = cpu_seconds(pid)
            if c:
                self.first.setdefault(pid, c if not self._started else 0.0)
                self.last[pid] = c

    @property
    def matched(self) -> bool:
        return bool(self.last)

    @property
    def seconds(self) -> float:
        return sum(self.last[p] - self.first.get(p, 0.0) for p in self.last)

    def close(self) -> None:
        self.conn.close()


OWN_WAL = """
WITH rels AS (
    SELECT %(db)s::text || '/' || c.relfilenode::text AS rel
    FROM pg_class AS c
    WHERE c.relfilenode <> 0
      AND (c.relnamespace = %(schema)s::regnamespace
           OR c.oid IN (SELECT reltoastrelid FROM pg_class WHERE relnamespace = %(schema)s::regnamespace)
           OR c.oid IN (SELECT i.indexrelid FROM pg_index AS i JOIN pg_class AS t ON t.oid = i.indrelid
                        WHERE t.relnamespace = 'pg_toast'::regnamespace
                          AND t.oid IN (SELECT reltoastrelid FROM pg_class
                                        WHERE relnamespace = %(schema)s::regnamespace)))
), r AS (
    SELECT xid::text::bigint AS xid, record_length, substring(block_ref FROM 'rel \\d+/(\\d+/\\d+)') AS rel
    FROM pg_get_wal_records_info(%(start)s::pg_lsn, least(%(end)s::pg_lsn, pg_current_wal_flush_lsn()))
), mine AS (
    SELECT DISTINCT xid FROM r WHERE xid <> 0 AND rel IN (SELECT rel FROM rels)
)
SELECT coalesce(sum(record_length), 0)::bigint FROM r
WHERE xid IN (SELECT xid FROM mine) OR (xid = 0 AND rel IN (SELECT rel FROM rels))
"""


class RunWal:
    """The WAL a run wrote. ``own``: the records of the transactions that touched the run's
    schema (and the transaction-less records on its relations, such as page pruning),
    read back with pg_walinspect, so other sessions on a shared server do not count;
    None where pg_walinspect cannot be used (it needs a superuser or pg_read_server_files,
    and the WAL still on disk). ``lsn``: the insert position's difference, all sessions'."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn, self.schema = dsn, schema
        with connect(dsn) as conn:
            self.start = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]

    def finish(self) -> tuple[int, int | None]:
        with connect(self.dsn) as conn:
            end, lsn = conn.execute("SELECT pg_current_wal_insert_lsn()::text, "
                                    "(pg_current_wal_insert_lsn() - %s::pg_lsn)::bigint", [self.start]).fetchone()
            try:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
                db = conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0]
                own = conn.execute(OWN_WAL, {"db": db, "schema": self.schema, "start": self.start,
                                             "end": end}).fetchone()[0]
            except psycopg.Error:
                own = None
        return int(lsn), (int(own) if own is not None else None)


def wal_figures(lsn: int, own: int | None, jobs: int) -> dict[str, float]:
    """WAL bytes per job for a result: the run's own when known, the LSN difference beside it."""
    per = lambda v: round(v / jobs, 1) if jobs else 0.0  # noqa: E731
    return {"wal_bytes_per_job": per(own if own is not None else lsn), "wal_bytes_per_job_lsn": per(lsn),
            "wal_own": own is not None}
