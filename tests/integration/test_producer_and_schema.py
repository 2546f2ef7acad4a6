"""Enqueueing (transactional, bulk, deduplicated), migrations, and bad input."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import psycopg
import pytest
from psycopg import sql

from pgworker import (App, ConfigError, DatabaseUnavailable, InvalidName, JobSpec, PayloadError,
                      SchemaNotMigrated, SchemaTooNew, UnknownTask)
from pgworker.migrate import latest_version, migrate

pytestmark = pytest.mark.integration


def listen(pg_dsn, app):
    conn = psycopg.connect(pg_dsn, autocommit=True)
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(app.store.channel)))
    return conn


def notes(conn, wait=0.3, expect=None):
    return [n.payload for n in conn.notifies(timeout=wait, stop_after=expect)]


def count(conn, app):
    return conn.execute(sql.SQL("SELECT count(*) FROM {}.jobs").format(sql.Identifier(app.settings.schema))).fetchone()[0]


def test_enqueue_in_the_callers_transaction(app, pg_dsn, conn):
    listener = listen(pg_dsn, app)
    with psycopg.connect(pg_dsn) as tx:
        app.enqueue("t", {"order": 1}, conn=tx)
        assert count(conn, app) == 0  # not visible before commit
        assert notes(listener) == []
        tx.rollback()
    assert count(conn, app) == 0 and notes(listener) == []  # rollback: no job, no wake-up
    with psycopg.connect(pg_dsn) as tx:
        job_id = app.enqueue("t", {"order": 2}, conn=tx)
        assert notes(listener) == []  # NOTIFY waits for the commit
        tx.commit()
    assert notes(listener, 5, expect=1) == ["default"]
    assert app.get_job(job_id)["payload"] == {"order": 2}
    listener.close()


def test_delayed_jobs_do_not_wake_anyone(app, pg_dsn):
    listener = listen(pg_dsn, app)
    app.enqueue("t", delay=60)
    app.enqueue("t", run_at=datetime.now(timezone.utc) + timedelta(minutes=5))
    assert notes(listener) == []
    assert app.claim() == []
    listener.close()


def test_enqueue_many_notifies_once_per_queue(app, pg_dsn):
    listener = listen(pg_dsn, app)
    ids = app.enqueue_many([JobSpec("t", i, queue="a" if i % 2 else "b") for i in range(3000)])
    assert len(ids) == 3000 and len(set(ids)) == 3000
    assert sorted(notes(listener, 5, expect=2)) == ["a", "b"]
    assert notes(listener) == []  # and no more
    assert len(app.claim("a", limit=5000)) == 1500
    listener.close()


@pytest.mark.parametrize("keyed", [False, True], ids=["copy", "insert"])
def test_enqueue_many_payloads_round_trip(app, keyed):
    payloads = [{"n": 1, "nested": {"list": [1, "two", None]}}, "text", 3.5, None, [True, False], {"q": "it's"}]
    specs = [JobSpec("t", p, dedupe_key=f"k{i}" if keyed else None) for i, p in enumerate(payloads)]
    ids = app.enqueue_many(specs)
    got = {j.id: j.payload for j in app.claim(limit=10)}
    assert [got[i] for i in ids] == payloads


def test_enqueue_many_rolls_back_with_the_caller(app, pg_dsn, conn):
    with psycopg.connect(pg_dsn) as tx:
        app.enqueue_many([("t", i) for i in range(100)], conn=tx)
        tx.rollback()
    assert count(conn, app) == 0


def test_enqueue_many_is_all_or_nothing_on_bad_input(app, conn):
    with pytest.raises(PayloadError):
        app.enqueue_many([("t", 1), ("t", {1, 2}), ("t", 3)])
    assert count(conn, app) == 0


def test_dedupe_returns_the_existing_job_and_keeps_the_transaction(app, pg_dsn):
    first = app.enqueue("t", 1, dedupe_key="invoice-7")
    with psycopg.connect(pg_dsn) as tx:
        assert app.enqueue("t", 2, dedupe_key="invoice-7", conn=tx) == first
        tx.execute("SELECT 1")  # the transaction is still usable
        tx.commit()
    ids = app.enqueue_many([JobSpec("t", i, dedupe_key=f"k{i % 3}") for i in range(9)] +
                           [JobSpec("t", "x", dedupe_key="invoice-7")])
    assert len(set(ids[:9])) == 3 and ids[9] == first
    [job] = [j for j in app.claim(limit=10) if j.id == first]
    app.complete(job)
    assert app.enqueue("t", 3, dedupe_key="invoice-7") != first  # a finished job frees its key


def test_concurrent_producers_racing_on_one_dedupe_key(app, pg_dsn):
    results: list[int] = []
    barrier = threading.Barrier(8)

    def producer():
        with psycopg.connect(pg_dsn) as tx:
            barrier.wait()
            results.append(app.enqueue("t", None, dedupe_key="race", conn=tx))
            tx.commit()

    threads = [threading.Thread(target=producer) for _ in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(set(results)) == 1
    assert len(app.claim(limit=10)) == 1


def test_task_by_name_without_the_handler(app):
    job_id = app.enqueue("billing.charge_customer", {"customer": 9}, queue="billing")
    [job] = app.claim("billing")
    assert (job.id, job.task, job.max_attempts) == (job_id, "billing.charge_customer", 5)


def test_registered_task_defaults(app):
    @app.task(name="emails.send", queue="emails", max_attempts=9, priority=3)
    def send(payload):
        return None

    send.enqueue({"to": "a@example.com"})
    [job] = app.claim("emails")
    assert (job.max_attempts, job.priority) == (9, 3)


def test_an_app_that_knows_its_tasks_refuses_a_typo(app, conn):
    """A name the App does not register is refused with the closest names, before
    anything is written; any_task=True enqueues it on purpose (a task another service
    handles), and an App with no tasks (a pure producer) enqueues any name."""

    @app.task(name="greet", queue="greetings")
    def greet(payload):
        return None

    with pytest.raises(UnknownTask, match=r"task 'greeet' is not registered on this App \(did you mean "
                                          r"'greet'\?\).*any_task=True"):
        app.enqueue("greeet", {"to": "a"})
    with pytest.raises(UnknownTask, match="its tasks: 'greet'"):
        app.enqueue("zzz")
    with pytest.raises(UnknownTask, match="greeet"):  # one bad item: nothing of the batch is written
        app.enqueue_many([("greet", 1), JobSpec("greeet", 2)])
    assert count(conn, app) == 0
    other = app.enqueue("billing.charge", {"customer": 9}, any_task=True)
    many = app.enqueue_many([("billing.charge", 1), ("greet", 2)], any_task=True)
    assert [j.task for j in app.claim("default", limit=5)] == ["billing.charge", "billing.charge"]
    assert [j.id for j in app.claim("greetings")] == [many[1]] and other < many[0]
    producer = App(settings=app.settings)  # no tasks: enqueue by name, as before
    producer.enqueue("anything.at.all")
    producer.close()


@pytest.mark.parametrize("kwargs, error", [
    ({"queue": ""}, InvalidName), ({"queue": "x" * 200}, InvalidName), ({"queue": "a\x01"}, InvalidName),
    ({"payload": {1, 2}}, PayloadError), ({"payload": b"\x00"}, PayloadError),
    ({"payload": float("nan")}, PayloadError), ({"payload": "x" * (1 << 20)}, PayloadError),
    ({"max_attempts": 0}, ValueError), ({"run_at": datetime(2030, 1, 1)}, ValueError),
])
def test_bad_input_is_refused_and_nothing_is_written(app, conn, kwargs, error):
    existing = app.enqueue("t", "keep me")
    kwargs = dict(kwargs)
    payload = kwargs.pop("payload", None)
    with pytest.raises(error):
        app.enqueue("t", payload, **kwargs)
    assert count(conn, app) == 1 and app.get_job(existing)["payload"] == "keep me"


def test_migrate_is_idempotent_and_records_the_version(pg_dsn, schema):
    with App(settings=App(pg_dsn).settings.replace(schema=schema)) as app:
        _check_migrate(app)


def _check_migrate(app):
    first = app.migrate()
    assert first.version_before == 0 and first.version_after == latest_version() and first.applied
    again = app.migrate()
    assert not again.applied and again.version_after == latest_version()
    assert app.check_schema() == latest_version()


def test_concurrent_migrations_apply_once(pg_dsn, schema):
    reports = []

    def run():
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            reports.append(migrate(c, schema))

    threads = [threading.Thread(target=run) for _ in range(5)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sum(1 for r in reports if r.applied) == 1


def test_schema_version_checks(pg_dsn, schema, conn):
    with App(settings=App(pg_dsn).settings.replace(schema=schema)) as app:
        _check_versions(app, schema, conn)


def _check_versions(app, schema, conn):
    with pytest.raises(SchemaNotMigrated, match="pgworker migrate"):
        app.check_schema()
    app.migrate()
    conn.execute(sql.SQL("INSERT INTO {}.migrations (version, name, checksum) VALUES (%s, 'future', 'x')")
                 .format(sql.Identifier(schema)), [latest_version() + 1])
    with pytest.raises(SchemaTooNew, match="upgrade pgworker"):
        app.check_schema()
    with pytest.raises(SchemaTooNew):
        app.migrate()


def test_a_schema_named_in_another_case_gets_the_one_that_exists(pg_dsn, schema):
    """`PGWORKER_SCHEMA=NewUser_A pgworker status` said only that "NewUser_A.jobs" does
    not exist, beside the database's newuser_a (a new user's trial)."""
    from pgworker import connections

    with App(settings=App(pg_dsn).settings.replace(schema=schema)) as app:
        app.migrate()
    connections._SCHEMAS_SEEN.clear()  # what an earlier test's error read a moment ago
    with App(settings=App(pg_dsn).settings.replace(schema=schema.upper())) as wrong:
        with pytest.raises(SchemaNotMigrated) as info:
            wrong.list_jobs()
    message = str(info.value)
    assert f"(did you mean {schema!r}?)" in message and "pgworker schemas in this database: " in message, message
    assert "pgworker migrate" in message
    # the start of `pgworker run` and `pgworker web` (App.check_schema) names it too
    with App(settings=App(pg_dsn).settings.replace(schema=schema.upper())) as wrong:
        with pytest.raises(SchemaNotMigrated) as info:
            wrong.check_schema()
    assert f"(did you mean {schema!r}?)" in str(info.value) and info.value.absent, info.value


def test_broken_and_unreachable_dsns_never_show_the_password():
    with pytest.raises(ConfigError) as info:
        App("postgresql://app:hunter2@localhost:5432/db?sslmode=nonsense&bogus_option=1").enqueue("t")
    assert "hunter2" not in str(info.value)
    with pytest.raises(ConfigError) as info:
        App("host=localhost password=hunter2 port")  # malformed key=value
    assert "hunter2" not in str(info.value)
    with pytest.raises(DatabaseUnavailable) as info:
        App("postgresql://app:hunter2@127.0.0.1:1/db").enqueue("t")
    assert "hunter2" not in str(info.value) and "PGWORKER_DSN" in str(info.value)


def test_a_connection_the_server_refuses_for_good_is_told_apart_from_an_unreachable_server(pg_dsn):
    """No such database, no such role: DatabaseRefused (a DatabaseUnavailable), one line
    naming the fix, no password; a port nobody listens on is unreachable, not refused."""
    from pgworker.db import connect
    from pgworker.errors import DatabaseRefused
    base = pg_dsn.rsplit("/", 1)[0]
    for dsn, text, fix in ((base + "/pgworker_no_such_db", 'database "pgworker_no_such_db" does not exist', "createdb"),
                           ("postgresql://pgworker_no_such_role:hunter2@127.0.0.1:5432/test",
                            'role "pgworker_no_such_role" does not exist', "create that role"),
                           # a quote in the name (the server does not escape it)
                           ("host=127.0.0.1 port=5432 user=postgres password=hunter2 dbname='we\"ird'",
                            'database "we"ird" does not exist', "createdb")):
        with pytest.raises(DatabaseRefused) as info:
            connect(dsn)
        message = str(info.value)
        assert text in message and fix in message and message.index(fix) < message.index(text)
        assert "\n" not in message and "hunter2" not in message
    with pytest.raises(DatabaseUnavailable) as unreachable:
        connect("postgresql://app:hunter2@127.0.0.1:1/db")
    assert not isinstance(unreachable.value, DatabaseRefused)


# The repeated hour of a fall-back: 02:30 in Berlin on 27 October 2030 happens twice,
# at 00:30 UTC (fold=0, still summer time) and at 01:30 UTC (fold=1). The two datetimes
# compare equal and hash alike (PEP 495): only their fold tells them apart.
FALL_BACK = [datetime(2030, 10, 27, 2, 30, tzinfo=ZoneInfo("Europe/Berlin"), fold=f) for f in (0, 1)]
FALL_BACK_UTC = [datetime(2030, 10, 27, h, 30, tzinfo=timezone.utc) for h in (0, 1)]


def run_ats(conn, app, ids):
    rows = dict(conn.execute(sql.SQL("SELECT id, run_at FROM {}.jobs WHERE id = ANY(%s)").format(
        sql.Identifier(app.settings.schema)), [list(ids)]).fetchall())
    return [rows[i] for i in ids]


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
def test_enqueue_keeps_the_fold_of_a_repeated_hour(app, conn, keyed):
    keys = [{"ordering_key": f"k{f}"} if keyed else {} for f in (0, 1)]
    ids = [app.enqueue("t", run_at=r, **k) for r, k in zip(FALL_BACK, keys)]
    assert run_ats(conn, app, ids) == FALL_BACK_UTC
    # and the other way round: the second enqueue is not served the first one's instant
    ids = [app.enqueue("t", run_at=r, **k) for r, k in zip(reversed(FALL_BACK), keys)]
    assert run_ats(conn, app, ids) == list(reversed(FALL_BACK_UTC))


@pytest.mark.parametrize("path", ["batch", "copy", "keyed"])
def test_enqueue_many_keeps_the_fold_of_a_repeated_hour(app, conn, path):
    n = {"batch": 2, "copy": 1000, "keyed": 2}[path]  # COPY from 1,000 jobs without keys
    specs = [JobSpec("t", i, run_at=FALL_BACK[i % 2], ordering_key="k" if path == "keyed" else None)
             for i in range(n)]
    ids = app.enqueue_many(specs)
    assert run_ats(conn, app, ids) == [FALL_BACK_UTC[i % 2] for i in range(n)]


def test_the_apps_own_connections_wait_for_a_lock_no_longer_than_lock_timeout(pg_dsn, schema):
    """`pgworker jobs list` hung with no word while a migration (any ACCESS EXCLUSIVE lock)
    held the jobs table: the App's pooled connections set no lock_timeout. They now set
    PGWORKER_LOCK_TIMEOUT_SECONDS, as a worker's sessions do: the call raises DatabaseBusy
    naming the fix; the async pool alike. A caller's own connection keeps its settings."""
    import asyncio

    from pgworker import DatabaseBusy

    settings = App(pg_dsn).settings.replace(schema=schema, lock_timeout_seconds=0.5)
    with App(settings=settings) as app, psycopg.connect(pg_dsn) as holder:
        app.migrate()
        job = app.enqueue("t")
        holder.execute(sql.SQL("LOCK TABLE {}.jobs IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(schema)))
        with pytest.raises(DatabaseBusy, match="another session holds a lock.*PGWORKER_LOCK_TIMEOUT_SECONDS"):
            app.get_job(job)

        async def read_async():
            try:
                await app.aget_job(job)
            finally:
                await app.aclose()
        with pytest.raises(DatabaseBusy, match="another session holds a lock"):
            asyncio.run(read_async())
        with app.connection() as c:
            assert c.execute("SHOW lock_timeout").fetchone()[0] == "500ms"
        holder.rollback()
        assert app.get_job(job)["state"] == "pending"
    with psycopg.connect(pg_dsn, autocommit=True) as own, App(settings=settings) as again:
        again.enqueue("t", conn=own)  # a caller's connection goes through the App as it is
        assert own.execute("SHOW lock_timeout").fetchone()[0] == "0"
