"""What the console needs from the rest of pgworker: retry now (App.retry and
`pgworker jobs retry`), the pod registry a real `pgworker run` keeps, and the viewer role
of `pgworker sql grants` that reads every page and can write nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest
from pg import wait_until
from psycopg import sql
from worker import Worker, q

from pgworker import grants

pytestmark = pytest.mark.integration
WEB_APP = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "apps", "web_app.py") + ":app"


def test_retry_now_brings_a_scheduled_job_forward_once_and_is_audited(app, conn):
    schema = app.settings.schema
    later = app.enqueue("quick", {"x": 1}, any_task=True, delay=3600)
    due = app.enqueue("quick", {"x": 2}, any_task=True)
    moved = app.retry(later, actor="alice")
    assert moved["id"] == later and moved["queue"] == "default"
    assert q(conn, schema, "SELECT run_at <= now() FROM {s}.jobs WHERE id = %s", later) == [(True,)]
    assert app.retry(later, actor="alice") is None   # due now: nothing left to bring forward
    assert app.retry(due, actor="alice") is None
    assert app.retry(10**9, actor="alice") is None
    q(conn, schema, "UPDATE {s}.jobs SET state = 'dead', finished_at = now(), run_at = now() + interval '1 hour' "
      "WHERE id = %s RETURNING id", due)
    assert app.retry(due, actor="alice") is None     # fenced by state: a dead job is replayed, not retried
    events = q(conn, schema, "SELECT job_id, kind, actor, detail ? 'previous_run_at' FROM {s}.job_events")
    assert events == [(later, "retried_now", "alice", True)]


def test_pgworker_jobs_retry_says_what_it_did_or_why_not(app, pg_dsn):
    later = app.enqueue("quick", None, any_task=True, delay=600)
    env = dict(os.environ, PGWORKER_DSN=pg_dsn, PGWORKER_SCHEMA=app.settings.schema)
    cli = [sys.executable, "-m", "pgworker.cli", "jobs", "retry"]
    r = subprocess.run([*cli, str(later)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and f"job {later}: due now (it was due " in r.stdout, r.stderr
    r = subprocess.run([*cli, str(later)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "pending and due already" in r.stderr
    r = subprocess.run([*cli, "999999"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "is unknown" in r.stderr


def test_a_running_pod_registers_what_its_claimers_hold_and_says_when_it_stops(app, pg_dsn, conn, tmp_path):
    schema = app.settings.schema
    job = app.enqueue("runs_until_cancelled", None, any_task=True)
    with Worker(pg_dsn, schema, "--concurrency", "2", "--lease", "3", app=WEB_APP,
                env={"WEB_TEST_DIR": str(tmp_path)}) as w:
        def held():
            rows = q(conn, schema, "SELECT claimers, stopped_at, pid, concurrency FROM {s}.pods")
            holds = [h for r in rows for c in r[0] for h in c["holds"]]
            return rows if any(h["job_id"] == job and h["state"] == "running" for h in holds) else None

        rows = wait_until(held, timeout=30, message="the pod's row with the running job")
        claimers, stopped_at, pid, concurrency = rows[0]
        assert stopped_at is None and pid == w.pid and concurrency == 2 and len(claimers) == 2
        hold = next(h for c in claimers for h in c["holds"] if h["job_id"] == job)
        token = q(conn, schema, "SELECT lease_token FROM {s}.jobs WHERE id = %s", job)[0][0]
        assert hold["lease_token"] == token and hold["task"] == "runs_until_cancelled"
        app.cancel(job, actor="t")
        wait_until(lambda: q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", job)[0][0] == "cancelled",
                   timeout=30, message="the cancellation")
        assert w.stop() == 0
    rows = q(conn, schema, "SELECT stopped_at IS NOT NULL, claimers FROM {s}.pods")
    assert rows == [(True, [])]


def test_the_viewer_role_reads_every_console_table_and_writes_none(app, pg_dsn, conn):
    schema = app.settings.schema
    role = f"viewer_{os.getpid()}"
    conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        job = app.enqueue("quick", {"a": 1}, any_task=True)
        with psycopg.connect(pg_dsn, autocommit=True) as owner:
            grants.apply(owner, grants.grant_statements(schema, viewer=role))
        dsn = psycopg.conninfo.make_conninfo(pg_dsn, user=role)
        from pgworker import App
        from pg import make_settings

        viewer = App(settings=make_settings(dsn, schema))
        try:
            with viewer.connection() as c:
                st = viewer.store
                assert st.console_queue_names(c, limit=10) == ["default"]
                assert st.console_queue_overview(c, ["default"], cap=10)[0]["due"] == 1
                assert st.console_jobs_window(c, job_filter={"payload": {"a": 1}}, before=2**62, scan=100,
                                              limit=5)[2][0]["id"] == job
                # a graph's window (jobs_graph_idx) and batch: the function's new signature is granted
                assert st.console_jobs_window(c, job_filter={"graph": 1}, before=2**62, scan=100, limit=5)[2] == []
                assert st.bulk_operation_candidates(c, job_filter={"graph": 1}, after=0, max_id=2**62, limit=5) == []
                st.console_throughput(c, limit=10), st.pods_list(c, limit=5), st.bulk_operations_list(c, before=9, limit=5)
                st.console_dead_groups(c, queue=None, scan=10, limit=10)
                assert viewer.get_job(job)["payload"] == {"a": 1}
                viewer.list_schedules()
                for write in (lambda: st.retry_now(c, job, actor="v"), lambda: st.cancel(c, job, actor="v"),
                              lambda: st.pause_queue(c, "default", actor="v"),
                              lambda: st.bulk_operation_create(c, kind="replay", job_filter={}, actor="v",
                                                               expected=None, batch_size=10)):
                    with pytest.raises(psycopg.errors.InsufficientPrivilege):
                        write()
        finally:
            viewer.close()
        assert q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", job) == [("pending",)]
    finally:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
