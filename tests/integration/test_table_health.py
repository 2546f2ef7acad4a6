"""The jobs table's health behind the pgworker_table_* gauges, read through the
supervisor's real statistics fetch (its session, its statement timeout) on a real
PostgreSQL: who holds the vacuum horizon (a session left idle in a REPEATABLE READ
transaction, as another role, a prepared transaction, a standby's replication slot),
dead rows a VACUUM cannot remove while it is held; and the autovacuum settings of
migration 0003 (present, overridable, kept by later migrations)."""

from __future__ import annotations

import math
import re
import os
import shutil
import subprocess
import tempfile
import time
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from psycopg import sql

from pg import make_settings, own_database, wait_until
from pgcluster import Cluster, free_port, missing_tools, require

from pgworker import App
from pgworker import grants
from pgworker import sql as sqlfiles
from pgworker.worker.stats import StatsSource
from pgworker.database_gauges import QueueStatsCollector
from pgworker.migrate import migrate

pytestmark = pytest.mark.integration
SCHEMA = "jobs health"  # a schema name that needs quoting, on purpose


# -- helpers -------------------------------------------------------------------------


class Gauges:
    """The collector behind a registry, read one collection at a time (cache off)."""

    def __init__(self, app: App) -> None:
        self.source = StatsSource(app.store, app.settings)
        self.registry = CollectorRegistry()
        self.registry.register(QueueStatsCollector(self.source.fetch, lambda: ["default"],
                                                   cache_seconds=0))

    def read(self) -> dict[str, Any]:
        """{metric name: [(labels, value), ...]} of one collection."""
        out: dict[str, Any] = {}
        for family in self.registry.collect():
            for s in family.samples:
                out.setdefault(s.name, []).append((dict(s.labels), s.value))
        return out

    def table(self) -> dict[str, Any]:
        """The table gauges of one collection: up, live, dead, size, vacuum ages by kind,
        and the single horizon series (labels, seconds, transactions); {'up': 0} when down."""
        r = self.read()
        [(_, up)] = r["pgworker_table_stats_up"]
        if not up:
            assert not [n for n in r if n.startswith("pgworker_table_") and n != "pgworker_table_stats_up"]
            return {"up": 0}
        [(holder, age)] = r["pgworker_table_horizon_age_seconds"]
        [(same, lag)] = r["pgworker_table_horizon_lag_transactions"]
        assert same == holder
        return {"up": up, "live": r["pgworker_table_live_tuples"][0][1],
                "dead": r["pgworker_table_dead_tuples"][0][1], "size": r["pgworker_table_size_bytes"][0][1],
                "vacuum": {ls["vacuum"]: v for ls, v in r["pgworker_table_last_vacuum_age_seconds"]},
                "holder": holder, "age": age, "lag": lag, "queue_up": r["pgworker_queue_stats_up"][0][1]}

    def close(self) -> None:
        self.source.close()


def jobs_flow(app: App, n: int) -> None:
    """n jobs enqueued, claimed and completed through the App API: 2n dead row versions."""
    app.enqueue_many([("t", i) for i in range(n)])
    done = 0
    while done < n:
        jobs = app.claim(limit=n)
        assert jobs, f"{n - done} jobs left unclaimed"
        for job in jobs:
            app.complete(job)
        done += len(jobs)


def vacuum(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SQL("VACUUM {}.jobs").format(sql.Identifier(schema)))


def holding(gauges: Gauges, **labels: str) -> Any:
    """A predicate for wait_until: the table gauges once the horizon holder has ``labels``."""
    def check() -> dict[str, Any] | None:
        t = gauges.table()
        return t if t["up"] and all(t["holder"].get(k) == v for k, v in labels.items()) else None
    return check


# -- a REPEATABLE READ session on the shared server -----------------------------------


@pytest.fixture
def lone_app(pg_dsn):
    """A migrated App in a database of its own: the horizon is per database, and sessions
    of other tests (or suites) in the shared one could hold an older snapshot."""
    with own_database(pg_dsn) as dsn:
        app = App(settings=make_settings(dsn, SCHEMA))
        app.migrate()
        gauges = Gauges(app)
        yield app, gauges
        gauges.close()
        app.close()


def test_a_session_idle_in_a_repeatable_read_transaction_is_named_and_blocks_vacuum(lone_app):
    app, gauges = lone_app
    dsn = app.settings.dsn
    with psycopg.connect(dsn, application_name="nightly-report") as report:
        report.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        report.execute(sql.SQL("SELECT count(*) FROM {}.jobs").format(sql.Identifier(SCHEMA))).fetchone()
        jobs_flow(app, 50)
        # the statistics system receives the counts within a second or so of each commit
        t = wait_until(lambda: (t := gauges.table())["dead"] >= 100 and t, 30, 0.2, message="100 dead rows")
        assert t["holder"] == {"holder": "backend", "holder_name": "nightly-report",
                               "holder_state": "idle in transaction"}
        assert 0 <= t["age"] < 300  # xact_start: this test's role may read it
        assert t["lag"] >= 50  # the enqueue, the claim, 50 completions
        assert t["size"] > 0 and t["queue_up"] == 1
        assert t["vacuum"]["manual"] == math.inf  # never by hand yet (autovacuum may have run)
        time.sleep(1.1)  # the age is the subject: it grows with the clock
        later = gauges.table()
        assert later["age"] >= t["age"] + 1.0 and later["holder"] == t["holder"]

        vacuum(dsn, SCHEMA)  # runs, but may remove nothing the report could still see
        after = gauges.table()
        assert after["vacuum"]["manual"] < 60
        assert after["dead"] >= 100, "VACUUM removed rows the REPEATABLE READ snapshot can see"
        report.rollback()
    wait_until(lambda: gauges.table()["holder"].get("holder_name") != "nightly-report", 30, 0.2,
               message="the report session to stop holding the horizon")
    vacuum(dsn, SCHEMA)
    t = wait_until(lambda: (t := gauges.table())["dead"] == 0 and t, 30, 0.2, message="dead rows removed")
    assert t["live"] == 50


def test_a_statistics_query_that_times_out_takes_the_table_gauges_down_too(app, pg_dsn):
    app.configure(app.settings.replace(stats_timeout_seconds=0.5))
    gauges = Gauges(app)
    try:
        assert gauges.table()["up"] == 1
        with psycopg.connect(pg_dsn) as locker:
            locker.execute(sql.SQL("LOCK TABLE {}.jobs IN ACCESS EXCLUSIVE MODE")
                           .format(sql.Identifier(app.settings.schema)))
            assert gauges.table() == {"up": 0}  # and no other pgworker_table_* series
            locker.rollback()
        assert gauges.table()["up"] == 1
    finally:
        gauges.close()


# -- other holders, and other roles: a throwaway cluster -----------------------------


@pytest.fixture(scope="module")
def cluster():
    require(missing_tools())
    c = Cluster(settings={"max_prepared_transactions": "4", "wal_receiver_status_interval": "1"})
    c.start()
    yield c
    c.destroy()


@pytest.fixture
def cluster_app(cluster):
    app = App(settings=make_settings(cluster.dsn(), SCHEMA))
    app.migrate()
    yield app
    app.close()
    cluster.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(SCHEMA)).as_string(None))


def test_a_role_without_pg_read_all_stats_sees_the_name_and_measures_the_age_itself(cluster, cluster_app):
    """The least-privileged worker role (`pgworker sql grants --worker`): another role's
    session shows its application_name but not its state nor its xact_start, so the age in
    seconds counts from the moment this collector first saw it hold the horizon."""
    cluster.execute("DROP ROLE IF EXISTS health_worker")
    cluster.execute("CREATE ROLE health_worker LOGIN")
    with psycopg.connect(cluster.dsn(), autocommit=True) as owner:
        grants.apply(owner, grants.grant_statements(SCHEMA, worker="health_worker"))
    worker_app = App(settings=make_settings(cluster.dsn("health_worker"), SCHEMA))
    gauges = Gauges(worker_app)
    try:
        with psycopg.connect(cluster.dsn(), application_name="etl-export") as etl:
            etl.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            etl.execute("SELECT count(*) FROM pg_class").fetchone()
            jobs_flow(cluster_app, 5)
            first = wait_until(holding(gauges, holder_name="etl-export"), 30, 0.2, message="etl-export")
            assert first["holder"] == {"holder": "backend", "holder_name": "etl-export", "holder_state": "unknown"}
            assert first["age"] < 5  # first seen just now (the session is older: a lower bound)
            assert first["lag"] >= 5
            time.sleep(1.1)
            assert gauges.table()["age"] >= first["age"] + 1.0
    finally:
        gauges.close()
        worker_app.close()


def test_a_prepared_transaction_holds_the_horizon_until_it_is_finished(cluster, cluster_app):
    with psycopg.connect(cluster.dsn(), autocommit=True) as c:
        c.execute("BEGIN")
        c.execute("SELECT pg_current_xact_id()")  # takes an xid, which the prepared transaction keeps
        c.execute("PREPARE TRANSACTION 'nightly-export'")
        gauges = Gauges(cluster_app)
        try:
            jobs_flow(cluster_app, 5)
            t = wait_until(holding(gauges, holder="prepared_transaction"), 30, 0.2, message="the prepared one")
            assert t["holder"] == {"holder": "prepared_transaction", "holder_name": "nightly-export",
                                   "holder_state": "prepared"}
            assert 0 <= t["age"] < 300 and t["lag"] >= 5
            c.execute("ROLLBACK PREPARED 'nightly-export'")
            wait_until(lambda: gauges.table()["holder"]["holder"] != "prepared_transaction", 30, 0.2,
                       message="the horizon released")
        finally:
            c.execute("SELECT 1")  # (the rollback above, or the cluster's end, releases it)
            gauges.close()


def test_a_standby_query_holds_the_horizon_through_its_replication_slot(cluster, cluster_app):
    """A real standby (pg_basebackup, a physical slot, hot_standby_feedback on): a
    REPEATABLE READ snapshot on the standby holds the primary's horizon through the slot's
    xmin, and the slot is named as its holder."""
    standby = tempfile.mkdtemp(prefix="pgworker-standby-")
    port = free_port()
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if prefix:
        shutil.chown(standby, "postgres", "postgres")
    # initdb may be a symlink on PATH; pg_basebackup sits beside its target
    bindir = os.path.dirname(os.path.realpath(os.path.join(cluster.bindir, "initdb")))
    require(None if os.path.exists(os.path.join(bindir, "pg_basebackup")) else f"no pg_basebackup in {bindir}")

    def run(*cmd: str) -> None:
        done = subprocess.run(prefix + list(cmd), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{cmd[0]} failed: {done.stdout}{done.stderr}"

    gauges = Gauges(cluster_app)
    try:
        run(os.path.join(bindir, "pg_basebackup"), "-h", "127.0.0.1", "-p", str(cluster.port), "-U", "postgres",
            "-D", standby, "-R", "-C", "-S", "standby_one", "-X", "stream", "-c", "fast")
        with open(os.path.join(standby, "postgresql.auto.conf"), "a") as f:
            f.write("hot_standby_feedback = 'on'\nwal_receiver_status_interval = '1'\n")
        run(os.path.join(bindir, "pg_ctl"), "-D", standby, "-w", "-l", os.path.join(standby, "server.log"),
            "-o", f"-p {port} -k {standby}", "start")
        replica = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        with psycopg.connect(replica, application_name="standby-report") as report:
            report.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            report.execute("SELECT count(*) FROM pg_class").fetchone()
            jobs_flow(cluster_app, 20)
            t = wait_until(holding(gauges, holder="replication_slot"), 30, 0.2, message="the slot")
            assert t["holder"] == {"holder": "replication_slot", "holder_name": "standby_one",
                                   "holder_state": "active"}
            # the standby's snapshot stays put while the primary moves on
            jobs_flow(cluster_app, 20)
            later = wait_until(lambda: (x := gauges.table())["lag"] >= t["lag"] + 20 and x, 30, 0.2,
                               message="the slot's lag to grow")
            assert later["holder"] == t["holder"]
            assert later["age"] >= t["age"]  # seconds since first seen: a slot records no time
    finally:
        gauges.close()
        subprocess.run(prefix + [os.path.join(bindir, "pg_ctl"), "-D", standby, "-w", "-m", "immediate", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(standby, ignore_errors=True)
        cluster.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                        "WHERE slot_name = 'standby_one'")


# -- migration 0003: the autovacuum settings ------------------------------------------


AUTOVACUUM = {"autovacuum_vacuum_scale_factor": "0.01", "autovacuum_vacuum_threshold": "1000",
              "autovacuum_vacuum_insert_scale_factor": "0.01", "autovacuum_analyze_scale_factor": "0.02"}


def reloptions(conn: psycopg.Connection, schema: str) -> dict[str, str]:
    [(options,)] = conn.execute("SELECT reloptions FROM pg_class WHERE oid = %s::regclass",
                                [sql.Identifier(schema, "jobs").as_string(conn)]).fetchall()
    return dict(o.split("=", 1) for o in options or [])


# Migration 0010 sets fillfactor 70 when no fill factor is set (so renewals are HOT: the
# lease is in no index since then, and a HOT version needs room on its page).
FILLFACTOR = {"fillfactor": "70"}


def test_the_jobs_table_has_the_migrations_autovacuum_settings(app, conn):
    assert reloptions(conn, app.settings.schema) == {**AUTOVACUUM, **FILLFACTOR}


def test_an_operators_override_survives_the_migrations_after_0003(pg_dsn, schema):
    """Migrations 1..3 by hand, an operator's ALTER TABLE ... SET, then `migrate` applies
    whatever came later: the override stays (later migrations never SET or RESET these)."""
    ident = sql.Identifier(schema)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        with conn.transaction():
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
            conn.execute(sql.SQL("CREATE TABLE {}.migrations (version integer PRIMARY KEY, name text NOT NULL, "
                                 "checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
                         .format(ident))
            for mig in sqlfiles.migrations()[:3]:
                conn.execute(sqlfiles.render(mig.template, schema))
                conn.execute(sql.SQL("INSERT INTO {}.migrations (version, name, checksum) VALUES (%s, %s, %s)")
                             .format(ident), [mig.version, mig.name, mig.checksum])
        assert reloptions(conn, schema) == AUTOVACUUM
        conn.execute(sql.SQL("ALTER TABLE {}.jobs SET (autovacuum_vacuum_scale_factor = 0.05, fillfactor = 90)")
                     .format(ident))
        conn.execute(sql.SQL("ALTER TABLE {}.jobs RESET (autovacuum_analyze_scale_factor)").format(ident))
        report = migrate(conn, schema)
        assert report.version_after == len(sqlfiles.migrations())
        expected = {k: v for k, v in AUTOVACUUM.items() if k != "autovacuum_analyze_scale_factor"}
        assert reloptions(conn, schema) == {**expected, "autovacuum_vacuum_scale_factor": "0.05", "fillfactor": "90"}


def test_migration_0010_sets_the_fill_factor_only_where_none_is_set(pg_dsn, schema):
    """An operator's fill factor set before migration 0010 stays; without one, 0010 sets 70."""
    ident = sql.Identifier(schema)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        with conn.transaction():
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
            conn.execute(sql.SQL("CREATE TABLE {}.migrations (version integer PRIMARY KEY, name text NOT NULL, "
                                 "checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
                         .format(ident))
            known = sqlfiles.migrations()
            for mig in known[:next(i for i, m in enumerate(known) if m.name == "running_index")]:
                conn.execute(sqlfiles.render(mig.template, schema))
                conn.execute(sql.SQL("INSERT INTO {}.migrations (version, name, checksum) VALUES (%s, %s, %s)")
                             .format(ident), [mig.version, mig.name, mig.checksum])
        assert "fillfactor" not in reloptions(conn, schema)
        conn.execute(sql.SQL("ALTER TABLE {}.jobs SET (fillfactor = 100)").format(ident))
        conn.execute("SET search_path = pg_catalog, public")
        migrate(conn, schema)
        assert reloptions(conn, schema) == {**AUTOVACUUM, "fillfactor": "100"}
        # 0010 sets search_path to the schema for its block, then puts the session's back
        assert conn.execute("SHOW search_path").fetchone()[0] == "pg_catalog, public"


# The one deliberate exception (issue 23): migration 0010 sets the jobs table's fill factor,
# guarded so that it does so only when none is set (an operator's value stays, as the
# rule below wants; test_migration_0010_sets_the_fill_factor_only_where_none_is_set).
GUARDED_FILLFACTOR = {"running_index"}


def test_no_later_migration_sets_or_resets_the_storage_parameters():
    """The static side of the test above, for migrations it cannot foresee: after 0003, no
    migration mentions the jobs table's storage parameters (but GUARDED_FILLFACTOR's)."""
    words = ("autovacuum_", "fillfactor", "toast.")
    # Only statements on the jobs table count: a migration may give a table of its own
    # (0006's pods registry, fillfactor 50) the storage parameters it needs.
    for mig in sqlfiles.migrations()[3:]:
        statements = [s for s in _without_comments(mig.template.lower()).split(";") if _ON_JOBS.search(s)]
        allowed = ("fillfactor",) if mig.name in GUARDED_FILLFACTOR else ()
        if allowed:
            assert any("if not exists" in s and "fillfactor" in s for s in statements), (
                f"migration {mig.version:04d}_{mig.name} must set the fill factor only where none is set")
        assert not [w for s in statements for w in words if w in s and w not in allowed], (
            f"migration {mig.version:04d}_{mig.name} changes the jobs table's storage parameters, "
            "which operators may have overridden (docs/deploy.md, \"Vacuum and the jobs table\")")


_ON_JOBS = re.compile(r"\b(alter|create)\s+table\s+(if\s+(not\s+)?exists\s+)?(\{schema\}\.)?jobs\b")


def _without_comments(text: str) -> str:
    return re.sub(r"--[^\n]*", "", text)


def test_the_storage_parameter_check_sees_a_jobs_table_change():
    """The check above can fail: it flags a statement that sets the jobs table's storage
    parameters and passes one that sets another table's."""
    flagged = "ALTER TABLE {schema}.jobs SET (fillfactor = 70);"
    other = "CREATE TABLE {schema}.pods (id text) WITH (fillfactor = 50);"
    assert _ON_JOBS.search(_without_comments(flagged.lower()))
    assert not _ON_JOBS.search(_without_comments(other.lower()))
