"""pgworker.contrib.django in a real Django project (tests/django_project) against a real
PostgreSQL: `manage.py pgworker migrate|status|run` with the settings' database and
schema, and a view enqueueing inside transaction.atomic() on Django's connection (its
job rolls back with the view's writes, or commits and is run by a real worker)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from psycopg import sql

from worker import ACCEPTANCE_APP, HERE, create_ledger, q

pytestmark = pytest.mark.integration

pytest.importorskip("django", reason="Django is a test dependency (pip install -e '.[test]')")

PROJECT = os.path.join(HERE, "django_project")


def manage(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, os.path.join(PROJECT, "manage.py"), "pgworker", *args],
                          env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def project(pg_dsn, schema, monkeypatch):
    """The Django project configured (in this process too) for this test's schema."""
    env = dict(os.environ, SHOP_DSN=pg_dsn, SHOP_SCHEMA=schema, DJANGO_SETTINGS_MODULE="settings",
               PGWORKER_SCHEMA="somewhere_else", PGWORKER_DSN="")  # the Django settings must win
    env.pop("SHOP_WORKER_APP", None)
    for key in ("SHOP_DSN", "SHOP_SCHEMA", "DJANGO_SETTINGS_MODULE"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.syspath_prepend(PROJECT)
    return env


def test_manage_commands_and_a_view_enqueueing_in_its_transaction(project, pg_dsn, schema, conn):
    done = manage(project, "migrate")
    assert done.returncode == 0, done.stdout + done.stderr
    assert q(conn, schema, "SELECT count(*) FROM {s}.migrations")[0][0] > 0  # the settings' schema
    conn.execute(sql.SQL("CREATE TABLE {}.orders (id serial PRIMARY KEY, item text NOT NULL)").format(
        sql.Identifier(schema)))
    create_ledger(pg_dsn, schema)

    import django
    from django.test import Client

    from pgworker.contrib import django as pgworker_django

    django.setup()
    client = Client()
    refused = client.post("/orders", {"item": "x", "refuse": "1"})
    assert refused.status_code == 409
    assert q(conn, schema, "SELECT count(*) FROM {s}.orders")[0][0] == 0
    assert q(conn, schema, "SELECT count(*) FROM {s}.jobs")[0][0] == 0  # rolled back with the order
    made = [client.post("/orders", {"item": f"item {i}"}).json() for i in range(3)]
    assert client.get(f"/jobs/{made[0]['job']}").json() == {"state": "pending"}
    # outside atomic(), Django's autocommit: the enqueue commits at once
    alone = pgworker_django.enqueue("record", {"order": None}, any_task=True)
    assert q(conn, schema, "SELECT count(*) FROM {s}.jobs")[0][0] == 4
    from django.db import connections

    connections.close_all()

    status = manage(project, "status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "default" in status.stdout
    run = manage(dict(project, SHOP_WORKER_APP=ACCEPTANCE_APP), "run", "--drain", "--concurrency", "1",
                 "--metrics-port", "0", timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    ran = {r[0] for r in q(conn, schema, "SELECT job_id FROM {s}.ledger WHERE event = 'run'")}
    assert ran == {m["job"] for m in made} | {alone}
    bare = manage(project)  # no command: an error naming the commands, no traceback
    assert bare.returncode == 1 and "give a pgworker command: migrate, run, status" in bare.stderr
    assert "Traceback" not in bare.stderr


def migrated_shop(project, conn, schema, *items: str) -> None:
    """pgworker's schema migrated through manage.py, and the shop's orders table (the
    test project's model, by hand: it has no Django migrations) holding ``items``."""
    assert manage(project, "migrate").returncode == 0
    conn.execute(sql.SQL("CREATE TABLE {}.orders (id serial PRIMARY KEY, item text NOT NULL)").format(
        sql.Identifier(schema)))
    for item in items:
        conn.execute(sql.SQL("INSERT INTO {}.orders (item) VALUES (%s)").format(sql.Identifier(schema)), [item])


def test_a_worker_of_manage_py_runs_handlers_that_use_the_orm(project, pg_dsn, schema, conn):
    """Handlers importing models (at the top of the tasks module, as a project does) and
    querying them: the claimers once loaded the app without django.setup() (a trial:
    "Apps aren't loaded yet", or a claimer that exited before its first claim). A
    connection that dies under one job does not fail the next: each job starts with
    Django's close_old_connections, as a request does."""
    migrated_shop(project, conn, schema, "book", "pen")
    from pgworker import App

    producer = App(pg_dsn, schema=schema)
    try:
        lost = producer.enqueue("lose_connection", None, priority=10, max_attempts=1)
        ships = [producer.enqueue("ship_order", {"order": n}) for n in (1, 2)]
        # the same for async handlers, whose ORM calls run in asgiref's thread (a trial)
        alost = producer.enqueue("alose_connection", None, priority=5, max_attempts=1)
        acounts = [producer.enqueue("acount_orders", None, priority=4, max_attempts=1) for _ in range(2)]
        run = manage(dict(project, SHOP_WORKER_APP="shop.tasks:app"), "run", "--drain", "--concurrency", "1",
                     "--metrics-port", "0", timeout=120)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
        assert producer.get_job(lost)["state"] == "dead", run.stdout[-2000:] + run.stderr[-3000:]
        assert [producer.get_job(j)["state"] for j in ships] == ["succeeded", "succeeded"], run.stderr[-3000:]
        assert producer.result(ships[1]) == 2
        assert producer.get_job(alost)["state"] == "dead"
        assert [producer.get_job(j)["state"] for j in acounts] == ["succeeded", "succeeded"], run.stderr[-3000:]
        assert producer.result(acounts[0]) == 2
    finally:
        producer.close()
    assert q(conn, schema, "SELECT item FROM {s}.orders ORDER BY id") == [("shipped: book",), ("shipped: pen",)]


def test_a_handler_that_leaves_a_transaction_open_fails_and_the_next_job_runs(project, pg_dsn, schema, conn):
    """A handler that enters atomic() and never exits it: its write was never committed,
    so the attempt goes dead (TRANSACTION_LEFT_OPEN, naming the fix) instead of succeeding,
    and the next ORM job runs on a fresh connection (a break-it trial: Django kept the
    closed connection "in a transaction" and every later ORM call in that claimer failed)."""
    migrated_shop(project, conn, schema, "book")
    from pgworker import App

    producer = App(pg_dsn, schema=schema)
    try:
        left = producer.enqueue("leave_atomic_open", None, priority=10)
        by_hand = producer.enqueue("commit_by_hand", None, priority=9)  # a break-it trial: read as left open
        ship = producer.enqueue("ship_order", {"order": 1})
        run = manage(dict(project, SHOP_WORKER_APP="shop.tasks:app"), "run", "--drain", "--concurrency", "1",
                     "--metrics-port", "0", timeout=120)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
        job = producer.get_job(left)
        assert (job["state"], job["attempts"], job["last_error_code"]) == ("dead", 1, "TRANSACTION_LEFT_OPEN"), job
        assert "with transaction.atomic():" in job["errors"][-1]["message"], job["errors"]
        assert producer.get_job(by_hand)["state"] == "succeeded", run.stderr[-3000:]
        assert producer.get_job(ship)["state"] == "succeeded", run.stderr[-3000:]
    finally:
        producer.close()
    assert q(conn, schema, "SELECT item FROM {s}.orders ORDER BY id") == [("shipped: book",), ("committed by hand",)]


def test_an_enqueue_before_migrate_says_how_a_django_project_migrates(project):
    import django

    from pgworker import SchemaNotMigrated
    from pgworker.contrib import django as pgworker_django

    django.setup()
    with pytest.raises(SchemaNotMigrated) as raised:
        pgworker_django.enqueue("record", {"order": None}, any_task=True)
    note = " ".join(getattr(raised.value, "__notes__", []))
    assert "PGWORKER['SCHEMA']" in note and "python manage.py pgworker migrate" in note, note
    from django.db import connections

    connections.close_all()


def test_the_hook_around_each_job_does_not_wait_for_a_busy_orm_thread(project, monkeypatch):
    """An async handler that timed out may leave a blocking ORM call running in asgiref's
    thread: closing that thread's connections waits a bounded time, then the claimer goes
    on (the executor logs the hook's failure), instead of hanging behind the call."""
    import concurrent.futures
    import threading

    from asgiref.sync import SyncToAsync

    from pgworker.contrib import django as pgworker_django

    monkeypatch.setattr(pgworker_django, "ORM_THREAD_WAIT_SECONDS", 0.2)
    around_job = pgworker_django.setup_worker_process()
    around_job()  # the thread idle (or not started yet): returns at once
    release = threading.Event()
    busy = SyncToAsync.single_thread_executor.submit(release.wait, 30)
    try:
        with pytest.raises(concurrent.futures.TimeoutError):
            around_job()
    finally:
        release.set()
        busy.result(timeout=10)
    around_job()
    from django.db import connections

    connections.close_all()
