"""Running real `pgworker run` processes from tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import psycopg
from psycopg import sql

HERE = os.path.dirname(os.path.abspath(__file__))
# Where a Worker's log goes unless the test says: the running test's tmp_path (set by an
# autouse fixture in conftest.py), so the suite leaves no log files in /tmp; pytest keeps
# the last few sessions' tmp_path folders, failed tests' logs included.
LOG_DIR: str | None = None
ACCEPTANCE_APP = os.path.join(HERE, "apps", "acceptance_app.py") + ":app"

LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS {schema}.ledger (
    id bigserial PRIMARY KEY, idempotency_key text, job_id bigint, attempt int, lease_token bigint,
    event text, pid int, note text, at timestamptz DEFAULT clock_timestamp());
CREATE TABLE IF NOT EXISTS {schema}.effects (
    idempotency_key text PRIMARY KEY, job_id bigint, times int NOT NULL DEFAULT 1);
"""


def create_ledger(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SQL(LEDGER_DDL).format(schema=sql.Identifier(schema)))


def knowing(app: Any, dsn: str, app_path: str = ACCEPTANCE_APP) -> Any:
    """``app`` (the test's App) knowing the tasks of the app at ``app_path`` (so enqueue
    uses their defaults), with a ledger table in its schema: the ``env`` fixture
    (tests/conftest.py), and the fixtures of tests that run another test app."""
    from pgworker.loader import load_app

    create_ledger(dsn, app.settings.schema)
    app.tasks.update(load_app(app_path).tasks)
    return app


class Worker:
    """A `pgworker run` subprocess in its own process group."""

    def __init__(self, dsn: str, schema: str, *args: str, app: str = ACCEPTANCE_APP,
                 env: dict[str, str] | None = None, log_dir: str | None = None, name: str = "worker",
                 launcher: str | None = None) -> None:
        """``launcher``: a script run instead of ``-m pgworker.cli`` with the same arguments
        (e.g. tests/apps/wallclock_step.py, which steps the supervisor's wall clock)."""
        self.env = dict(os.environ, PGWORKER_DSN=dsn, PGWORKER_SCHEMA=schema, PGWORKER_LOG_LEVEL="INFO",
                        PYTHONUNBUFFERED="1", **(env or {}))
        self.env.setdefault("LEDGER_DSN", dsn)
        self.env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        entry = [launcher] if launcher else ["-m", "pgworker.cli"]
        self.cmd = [sys.executable, *entry, "run", "--app", app, *args]
        if "--metrics-port" not in args:
            self.cmd += ["--metrics-port", "0"]
        self.log_path = os.path.join(log_dir or LOG_DIR or tempfile.gettempdir(),
                                     f"pgworker-{name}-{os.getpid()}-{time.monotonic_ns()}.log")
        self.log = open(self.log_path, "w+")
        # stdout to a file, not a pipe: a pipe is read only after the exit, and a run that
        # prints more than its 64 KiB (the console span exporter does) blocked on it forever
        self.out = open(self.log_path + ".stdout", "w+")
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=self.out, stderr=self.log,
                                     start_new_session=True, text=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def claimer_pids(self) -> list[int]:
        """Live claimer processes: the children of the pod's fork server (multiprocessing's
        forkserver, a child of the supervisor), or children running spawn_main."""
        return sorted(claimer_processes(self.pid))

    def fork_server_pids(self) -> list[int]:
        """The supervisor's live fork server(s) (multiprocessing's forkserver main)."""
        return sorted(pid for pid, cmd, state in _proc_children().get(self.pid, [])
                      if b"multiprocessing.forkserver" in cmd and state not in "ZX")

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def signal_group(self, sig: int) -> None:
        os.killpg(self.pid, sig)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"worker did not exit within {timeout}s; log:\n{self.logs()[-4000:]}")

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def stdout(self) -> str:
        """What the worker printed on stdout so far (the drain summary, console spans)."""
        self.out.flush()
        with open(self.out.name) as f:
            return f.read()

    def logs(self) -> str:
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc.poll() is None:
            self.kill()
        self.log.close()
        self.out.close()


def q(conn: psycopg.Connection, schema: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    """Run a query with {s} standing for the quoted schema."""
    return conn.execute(sql.SQL(query).format(s=sql.Identifier(schema)), params).fetchall()


def _proc_children() -> dict[int, list[tuple[int, bytes, str]]]:
    """ppid -> [(pid, cmdline, state letter)] of every process (from /proc)."""
    out: dict[int, list[tuple[int, bytes, str]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            rest = stat[stat.rfind(")") + 2:].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
            out.setdefault(int(rest[1]), []).append((int(entry), cmd, rest[0]))
        except (OSError, ValueError, IndexError):
            continue
    return out


def claimer_processes(supervisor_pid: int) -> list[int]:
    """The live claimer processes of the supervisor ``supervisor_pid``: children of its
    fork server (a child whose command line runs multiprocessing.forkserver's main), or
    its own children running spawn_main; never the resource tracker."""
    tree = _proc_children()
    out = []
    for pid, cmd, state in tree.get(supervisor_pid, []):
        if b"multiprocessing.forkserver" in cmd:
            out += [c for c, _, st in tree.get(pid, []) if st not in "ZX"]
        elif b"spawn_main" in cmd and b"resource_tracker" not in cmd and state not in "ZX":
            out.append(pid)
    return out

