"""Finding a PostgreSQL server for the tests, in the documented order.

1. ``PGWORKER_TEST_DSN``;
2. a testcontainers PostgreSQL, when a Docker engine answers;
3. a server already listening on 127.0.0.1:5432 (database ``test``, user ``postgres``);
4. a throwaway cluster made with initdb/pg_ctl (as the ``postgres`` user via runuser when
   running as root: initdb refuses root);
5. the embedded server ``pgworker demo`` uses (the ``pgserver`` package).
When none is found the tests fail (they never silently skip the database).
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Iterator

import psycopg

LOCAL_DSN = "postgresql://postgres@127.0.0.1:5432/test"
_own_counter = itertools.count()


def _can_connect(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return True
    except Exception:
        return False


def _docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.ping()
        return True
    except Exception:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _initdb_cluster() -> str | None:
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    initdb = shutil.which("initdb") or (bins[-1] if bins else None)
    if not initdb:
        return None
    bindir = os.path.dirname(initdb)
    root = os.geteuid() == 0
    data = tempfile.mkdtemp(prefix="pgworker-test-pg-")
    port = _free_port()
    prefix = ["runuser", "-u", "postgres", "--"] if root else []
    if root:
        shutil.chown(data, "postgres", "postgres")
    try:
        subprocess.run(prefix + [initdb, "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8"],
                       check=True, capture_output=True)
        subprocess.run(prefix + [os.path.join(bindir, "pg_ctl"), "-D", data, "-w", "-l", f"{data}/log",
                                 "-o", f"-p {port} -k {data} -c listen_addresses=127.0.0.1", "start"],
                       check=True, capture_output=True)
    except Exception:
        return None
    atexit.register(lambda: subprocess.run(prefix + [os.path.join(bindir, "pg_ctl"), "-D", data, "-m",
                                                     "immediate", "stop"], capture_output=True))
    dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    return dsn if _can_connect(dsn) else None


def _pgserver() -> str | None:
    try:
        import pgserver
    except ImportError:
        return None
    data = tempfile.mkdtemp(prefix="pgworker-test-pgserver-")
    server = pgserver.get_server(data, cleanup_mode="delete")
    atexit.register(server.cleanup)
    return server.get_uri()


def find_postgres() -> tuple[str, str]:
    """(dsn, how it was found). Raises RuntimeError when no server can be had."""
    dsn = os.environ.get("PGWORKER_TEST_DSN")
    if dsn:
        return dsn, "PGWORKER_TEST_DSN"
    if _docker_answers():
        try:
            from testcontainers.postgres import PostgresContainer

            container = PostgresContainer("postgres:16-alpine", driver=None)
            container.start()
            atexit.register(container.stop)
            return container.get_connection_url(), "testcontainers"
        except Exception:
            pass
    if _can_connect(LOCAL_DSN):
        return LOCAL_DSN, "local server on 127.0.0.1:5432"
    for finder, how in ((_initdb_cluster, "throwaway initdb cluster"), (_pgserver, "embedded pgserver")):
        dsn = finder()
        if dsn:
            return dsn, how
    raise RuntimeError("no PostgreSQL found: set PGWORKER_TEST_DSN, start Docker, or run a server "
                       "on 127.0.0.1:5432 (pg_ctlcluster 15 main start)")


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.05, message: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value; returns it, or raises."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message() if callable(message) else message}")
        time.sleep(interval)


def make_settings(dsn: str, schema: str, **overrides):
    """Worker settings for tests: no metrics port, two claimers, tracing off."""
    from pgworker import Settings

    base = dict(dsn=dsn, schema=schema, metrics_port=0, concurrency=2, tracing=False)
    base.update(overrides)
    return Settings.from_env(environ={}, **base)


@contextlib.contextmanager
def own_database(dsn: str) -> Iterator[str]:
    """A database of its own on the server of ``dsn`` (which must allow CREATE DATABASE),
    dropped afterwards with whoever is still connected; yields its DSN.

    For what PostgreSQL keeps per database, such as the vacuum horizon of its tables: a
    session of another test, or of another suite sharing the server, holding a snapshot in
    the shared database would otherwise be the oldest holder instead of the test's own."""
    from psycopg import conninfo, sql

    name = f"pgworker_own_{os.getpid()}_{next(_own_counter)}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield conninfo.make_conninfo(dsn, dbname=name)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def sqlalchemy_url(dsn: str) -> str:
    """The SQLAlchemy URL of a libpq DSN, on the psycopg (3) driver."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    return (f"postgresql+psycopg://{info.get('user', 'postgres')}@{info.get('host', '127.0.0.1')}:"
            f"{info.get('port', 5432)}/{info.get('dbname', 'test')}")
