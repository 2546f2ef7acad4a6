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
