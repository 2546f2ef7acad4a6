"""pgworker behind pgbouncer in transaction mode (Debian's pgbouncer, started here on
loopback with a generated config): migrations, enqueue, claim, renew, complete and the
reaper go through the pooler; LISTEN takes the direct connection (--listen-dsn) and is
refused through the pooler with an error naming that setting; prepared statements are
turned off on pooled connections (detected), and where they break anyway the error
names PGWORKER_PREPARED_STATEMENTS."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import psycopg
import pytest

from pg import wait_until
from pgcluster import free_port, require
from worker import ACCEPTANCE_APP, Worker, create_ledger, q

pytestmark = pytest.mark.acceptance


class Bouncer:
    """pgbouncer in transaction mode in front of the test server, as the postgres user
    (pgbouncer refuses to run as root)."""

    def __init__(self, backend_dsn: str, *, extra: str = "") -> None:
        info = psycopg.conninfo.conninfo_to_dict(backend_dsn)
        self.dir = tempfile.mkdtemp(prefix="pgworker-bouncer-")
        self.port = free_port()
        self.dbname = info.get("dbname", "test")
        self.user = info.get("user", "postgres")
        with open(os.path.join(self.dir, "userlist.txt"), "w") as f:
            f.write(f'"{self.user}" ""\n')
        with open(os.path.join(self.dir, "pgbouncer.ini"), "w") as f:
            f.write(f"""[databases]
{self.dbname} = host={info.get('host', '127.0.0.1')} port={info.get('port', 5432)} dbname={self.dbname}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir}/userlist.txt
pool_mode = transaction
default_pool_size = 6
max_client_conn = 200
ignore_startup_parameters = extra_float_digits
logfile = {self.dir}/pgbouncer.log
pidfile = {self.dir}/pgbouncer.pid
{extra}
""")
        prefix = []
        if os.geteuid() == 0:
            prefix = ["runuser", "-u", "postgres", "--"]
            for name in ("", "userlist.txt", "pgbouncer.ini"):
                shutil.chown(os.path.join(self.dir, name), "postgres", "postgres")
        self.proc = subprocess.Popen(prefix + [shutil.which("pgbouncer"), os.path.join(self.dir, "pgbouncer.ini")],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not start: {self.proc.stdout.read()} {self.log()}")
                time.sleep(0.1)

    @property
    def dsn(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.dbname}"

    def log(self) -> str:
        try:
            with open(os.path.join(self.dir, "pgbouncer.log")) as f:
                return f.read()
        except OSError:
            return ""

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def _require_pgbouncer() -> None:
    require(None if shutil.which("pgbouncer") else
            "pgbouncer is not installed (Debian: apt-get install -y pgbouncer)")


@pytest.fixture
def bouncer(pg_dsn):
    _require_pgbouncer()
    b = Bouncer(pg_dsn)
    yield b
    b.close()


_TASKS: dict = {}


def _app(dsn, schema, **settings):
    from pgworker import App, Settings
    from pgworker.loader import load_app

    if not _TASKS:
        _TASKS.update(load_app(ACCEPTANCE_APP).tasks)
    app = App(settings=Settings.from_env(environ={}, dsn=dsn, schema=schema, metrics_port=0, **settings))
    app.tasks.update(_TASKS)
    return app


def test_the_whole_lifecycle_works_through_pgbouncer_transaction_mode(bouncer, pg_dsn, schema, conn):
    import threading

    # migrations through the pooler: a transaction-level advisory lock, several at once
    errors = []
    _app(pg_dsn, "unused")  # load the task module once, before the threads

    def migrate():
        try:
            _app(bouncer.dsn, schema).migrate()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=migrate) for _ in range(3)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors, errors
    out = subprocess.run([sys.executable, "-m", "pgworker.cli", "migrate", "--dsn", bouncer.dsn,
                          "--schema", schema], capture_output=True, text=True)
    assert out.returncode == 0 and "up to date" in out.stdout, out

    create_ledger(pg_dsn, schema)
    app = _app(bouncer.dsn, schema)
    # far more than psycopg's prepare threshold (5) on the same pooled connections
    single = [app.enqueue("record", i) for i in range(30)]
    bulk = app.enqueue_many([("record", 100 + i) for i in range(200)])
    ordered = [app.enqueue("record", 500 + i, ordering_key="k") for i in range(5)]
    slow = app.enqueue("sleep", {"seconds": 5})  # outlives the 3 s lease: renewals through the pooler
    # a lease that expired without an outcome: the reaper (through the pooler) recovers it
    stale = q(conn, schema, "INSERT INTO {s}.jobs (queue, task, payload, state, attempts, lease_token, "
                            "lease_expires_at) VALUES ('default', 'record', '999', 'running', 1, 1, "
                            "now() - interval '1 minute') RETURNING id")[0][0]
    app.close()
    n = len(single) + len(bulk) + len(ordered) + 2
    with Worker(bouncer.dsn, schema, "--listen-dsn", pg_dsn, "--concurrency", "2", "--lease", "3s",
                "--reap-interval", "1s", "--poll-interval", "1s", env={"LEDGER_DSN": pg_dsn}) as w:
        wait_until(lambda: q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE state = 'succeeded'")[0][0] == n,
                   120, message=lambda: f"all jobs through the pooler; log:\n{w.logs()[-3000:]}")
        assert w.stop() == 0
        logs = w.logs()
    assert q(conn, schema, "SELECT attempts, last_error_code FROM {s}.jobs WHERE id = %s", slow) == [(1, None)]
    assert q(conn, schema, "SELECT attempts, last_error_code FROM {s}.jobs WHERE id = %s", stale) == [(2, "LEASE_EXPIRED")]
    runs = [r[0] for r in q(conn, schema, "SELECT job_id FROM {s}.ledger WHERE job_id = ANY(%s) ORDER BY id", ordered)]
    assert runs == ordered  # per-key order held through the pooler
    assert "prepared statement" not in logs.lower().replace("server-side prepared statements are off", "")
    assert "connection pooler" in logs  # detected, and said once
    assert "prepared statement" not in bouncer.log().lower()


def test_listen_through_the_pooler_is_refused_naming_the_direct_dsn_setting(bouncer, app):
    with Worker(bouncer.dsn, app.settings.schema, "--concurrency", "1") as w:
        assert w.wait(60) == 1
        logs = w.logs()
    assert "PGWORKER_LISTEN_DSN" in logs and "--listen-dsn" in logs, logs


def test_prepared_statements_broken_by_a_pooler_give_an_error_naming_the_setting(pg_dsn, schema, monkeypatch):
    """A pooler that pgworker cannot detect, which also drops prepared statements after
    every transaction (DEALLOCATE ALL): the error names the setting; the setting fixes it."""
    _require_pgbouncer()
    from pgworker import db
    from pgworker.errors import PoolerError

    b = Bouncer(pg_dsn, extra="server_reset_query = DEALLOCATE ALL\nserver_reset_query_always = 1")
    try:
        _app(pg_dsn, schema).migrate()
        monkeypatch.setattr(db, "detect_pooler", lambda conn: False)
        app = _app(b.dsn, schema)
        with pytest.raises(PoolerError, match="PGWORKER_PREPARED_STATEMENTS=false"):
            for i in range(20):
                app.enqueue("record", i)
        app.close()
        app = _app(b.dsn, schema, prepared_statements=False)
        ids = [app.enqueue("record", i) for i in range(20)]
        app.close()
        assert len(ids) == 20
    finally:
        b.close()
