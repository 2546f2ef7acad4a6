"""What `pgworker status` reads: the live states exactly, from the partial indexes that
serve them, and the finished states bounded, so that its cost does not grow with the
retained history (it grouped over every row: 17,595 buffers on a modest table).

The cost is measured as PostgreSQL measures it: auto_explain with ANALYZE and BUFFERS
(the plan of every statement status runs, as EXPLAIN (ANALYZE, BUFFERS) prints it),
delivered to this session as notices."""

from __future__ import annotations

import json

import psycopg
import pytest
from psycopg import sql

from pgworker.status import status_reads

pytestmark = pytest.mark.integration


class PlanLog:
    """The plans of the statements run on ``conn`` (auto_explain, loaded in the session)."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.plans: list[dict] = []
        try:
            conn.execute("LOAD 'auto_explain'")
        except psycopg.Error as exc:  # not a superuser, or no contrib modules
            pytest.skip(f"auto_explain cannot be loaded: {exc.diag.message_primary}")
        for setting, value in (("log_min_duration", "0"), ("log_analyze", "on"), ("log_buffers", "on"),
                               ("log_timing", "off"), ("log_format", "json"), ("log_level", "notice")):
            conn.execute(sql.SQL("SET auto_explain.{} = {}").format(sql.Identifier(setting), sql.Literal(value)))
        conn.add_notice_handler(self._notice)

    def _notice(self, diag: psycopg.errors.Diagnostic) -> None:
        text = diag.message_primary or ""
        if "plan:" in text:
            self.plans.append(json.loads(text.split("plan:", 1)[1]))

    def buffers(self) -> int:
        """Shared buffers hit or read by the statements' plans (each node counts its children)."""
        return sum(p["Plan"]["Shared Hit Blocks"] + p["Plan"]["Shared Read Blocks"] for p in self.plans)


def measure(app, dsn: str) -> tuple[int, dict]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        log = PlanLog(conn)
        status_reads(app, conn)  # once to warm this session's catalog caches: their reads are not the subject
        log.plans.clear()
        reads = status_reads(app, conn)
        assert log.plans, "auto_explain reported no plan"
        return log.buffers(), reads


def finished(conn, schema: str, state: str, n: int, days_ago: int = 1) -> None:
    """``n`` jobs that finished ``days_ago`` days ago (a second apart), then VACUUM ANALYZE
    (as autovacuum would). Rows of a later call finish more recently: a bounded count, which
    reads the oldest first, reads the same rows before and after (their pages may not be
    all-visible yet when another session holds the vacuum horizon: then every read row
    costs a heap fetch, and a comparison of two measurements would compare that)."""
    conn.execute(sql.SQL("INSERT INTO {}.jobs (queue, task, payload, state, finished_at) "
                         "SELECT 'default', 't', '{{}}', %s, now() - %s * interval '1 day' + i * interval '1 second' "
                         "FROM generate_series(1, %s) AS i").format(sql.Identifier(schema)), [state, days_ago, n])
    conn.execute(sql.SQL("VACUUM ANALYZE {}.jobs").format(sql.Identifier(schema)))


def scans(plan: dict) -> list[tuple[str, str | None]]:
    """(node type, relation) of every node of a JSON plan."""
    out = [(plan["Node Type"], plan.get("Relation Name"))]
    for child in plan.get("Plans", []):
        out += scans(child)
    return out


def test_status_cost_does_not_grow_with_finished_jobs(app, conn, pg_dsn):
    schema = app.settings.schema
    app.enqueue_many([("t", i) for i in range(35)])
    app.enqueue_many([{"task": "t", "payload": i, "delay": 3600} for i in range(20)])
    app.enqueue("t", queue="emails")
    app.enqueue("t", queue="keyed", ordering_key="k")
    app.enqueue("t", queue="keyed", ordering_key="k")  # blocked behind the first
    app.claim("default", limit=5, lease_seconds=300)
    finished(conn, schema, "succeeded", 20_000, days_ago=9)
    finished(conn, schema, "cancelled", 500, days_ago=9)
    before, _ = measure(app, pg_dsn)
    finished(conn, schema, "succeeded", 180_000, days_ago=3)
    after, report_after = measure(app, pg_dsn)
    print(f"status read {before} buffers with 20,500 finished jobs, {after} with 200,500")
    assert after <= 1.2 * before + 20, (before, after)

    # the live states exact, the finished ones bounded: estimated past the limit
    live = {(r["queue"], r["state"]): r["jobs"] for r in report_after.state_rows() if r["queue"]}
    assert live == {("default", "due"): 30, ("default", "scheduled"): 20, ("default", "running"): 5,
                    ("emails", "due"): 1, ("keyed", "due"): 1, ("keyed", "blocked"): 1}
    done = {r["state"]: (r["jobs"], r["estimated"]) for r in report_after.state_rows() if r["queue"] is None}
    assert done["cancelled"] == (500, False)
    jobs, estimated = done["succeeded"]
    assert estimated and 150_000 <= jobs <= 250_000, done


def test_status_reads_no_table_sequentially(app, conn, pg_dsn):
    """Every read of jobs in every statement of status is an index scan (a table as in
    production: mostly finished rows, analyzed)."""
    schema = app.settings.schema
    app.enqueue_many([("t", i) for i in range(50)])
    app.enqueue("t", ordering_key="k")
    app.enqueue("t", ordering_key="k")
    finished(conn, schema, "succeeded", 100_000)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        log = PlanLog(c)
        status_reads(app, c)
    seq = [s for p in log.plans for s in scans(p["Plan"]) if s == ("Seq Scan", "jobs")]
    assert not seq, json.dumps(log.plans)[:4000]


def test_status_of_a_small_table_counts_finished_jobs_exactly(app, conn, pg_dsn):
    """Under the limit (a new install, the demo) the finished counts are exact, with no
    ANALYZE yet."""
    for _ in range(3):
        app.enqueue("t")
    jobs = app.claim("default", limit=3)
    app.complete(jobs[0])
    app.cancel(jobs[1].id)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        rows = status_reads(app, c).state_rows()
    assert {(r["queue"], r["state"], r["jobs"], r["estimated"]) for r in rows} == {
        ("default", "running", 2, False), (None, "succeeded", 1, False)}


def test_status_names_due_queues_that_no_live_pod_claims(app, conn, pg_dsn):
    """A job enqueued to a misspelt queue waits forever with nothing said: status names
    the queues with due jobs that no live pod of the registry claims, with the queues
    the live pods do claim. Stopped and gone pods claim nothing; with no pod alive (between
    drain runs) nothing is said."""
    store = app.store
    app.enqueue("t", queue="emails")
    app.enqueue("t", queue="emials")
    app.enqueue("t", queue="emials")
    app.enqueue("t", queue="reports", delay=3600)  # scheduled, not due: waits for its time anyway
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        assert status_reads(app, c).unclaimed == []  # no pod registered
        pod = dict(host="h", pid=1, version="0", concurrency=2, drain=False, claimers=[])
        store.pod_heartbeat(c, pod_id="old", queues=["emials"], **pod)
        store.pod_stop(c, "old")
        store.pod_heartbeat(c, pod_id="gone", queues=["emials"], **pod)
        c.execute(sql.SQL("UPDATE {}.pods SET last_seen = now() - interval '1 hour' WHERE id = 'gone'")
                  .format(sql.Identifier(app.settings.schema)))
        assert status_reads(app, c).unclaimed == []  # no pod alive
        store.pod_heartbeat(c, pod_id="live", queues=["emails", "default"], **pod)
        assert status_reads(app, c).unclaimed == [{"queue": "emials", "due": 2, "claimed": ["default", "emails"]}]
        store.pod_heartbeat(c, pod_id="live2", queues=["emials"], **pod)
        assert status_reads(app, c).unclaimed == []


def test_status_counts_jobs_waiting_for_their_parents(app, conn, pg_dsn):
    """A job waiting for its parents is pending and blocked, but not behind an ordering
    key: status counts it as waiting_on_parents, in its own queue (which holds nothing
    else, and was left out)."""
    parent = app.enqueue("t", delay=600)
    app.enqueue("t", depends_on=[parent], queue="children")
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        rows = status_reads(app, c).state_rows()
    assert {(r["queue"], r["state"], r["jobs"]) for r in rows} == {
        ("default", "scheduled", 1), ("children", "waiting_on_parents", 1)}


def test_status_says_more_than_the_limit_when_the_table_was_never_analyzed(app, conn):
    """Past the counting limit the finished states come from the planner's statistics; a
    table never analyzed (autovacuum off) has none: `status` says more than the limit
    and why, not a made-up estimate (a new user read "~10,001" for 61,753)."""
    from pgworker.cli.queues import _finished_jobs
    from pgworker.status import FINISHED_COUNT_LIMIT, status_reads

    ident = sql.Identifier(app.settings.schema)
    conn.execute(sql.SQL("ALTER TABLE {}.jobs SET (autovacuum_enabled = false)").format(ident))
    conn.execute(sql.SQL("INSERT INTO {}.jobs (queue, task, payload, state, finished_at) "
                         "SELECT 'default', 't', '{{}}', 'succeeded', now() FROM generate_series(1, %s)")
                 .format(ident), [FINISHED_COUNT_LIMIT + 50])
    assert conn.execute(sql.SQL("SELECT reltuples FROM pg_class WHERE oid = '{}.jobs'::regclass")
                        .format(ident)).fetchone()[0] < 0  # never analyzed
    report = status_reads(app, conn)
    [row] = [r for r in report.state_rows() if r["queue"] is None]
    assert row["more_than"] and row["jobs"] == FINISHED_COUNT_LIMIT
    assert _finished_jobs(row) == f">{FINISHED_COUNT_LIMIT:,} (not estimated: ANALYZE has not run on the jobs table)"
    conn.execute(sql.SQL("ANALYZE {}.jobs").format(ident))
    [row] = [r for r in status_reads(app, conn).state_rows() if r["queue"] is None]
    assert not row.get("more_than") and _finished_jobs(row).startswith("~")
