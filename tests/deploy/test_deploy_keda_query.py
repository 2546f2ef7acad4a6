"""The KEDA trigger query, taken from the chart as Helm renders it and run against a
migrated schema on the real PostgreSQL.

It must be non-zero whenever a pod has something to do, including with zero pods:
due pending jobs (to run), running jobs (a scale-down would stop them mid-job) and
running jobs whose lease expired (their pod died; only a running pgworker reaps them).
It must be zero when there is nothing to do (an empty queue, a job due later, due work
in a paused queue or in a queue the release does not serve), and it must stay cheap:
KEDA runs it every pollingInterval, so it reads the partial indexes, never the table.
"""

from __future__ import annotations

import json
import os

import psycopg
import psycopg.sql
import pytest

from deploytools import documents, merge, one, render, scenario_values
from pg import make_settings, wait_until
from pgworker import App
from pgworker.migrate import drop_schema
from worker import q

pytestmark = [pytest.mark.deploy, pytest.mark.integration]

KINDS = {"ScaledObject": "keda-scaledobject", "ScaledJob": "keda-scaledjob"}
PARTIAL_INDEXES = {"jobs_claim_idx", "jobs_due_idx", "jobs_running_idx"}


@pytest.fixture(scope="module")
def keda(pg_dsn):
    """One migrated schema for the module, and the trigger query of each KEDA object as
    the chart renders it for that schema (both scenarios serve the queue 'default')."""
    schema = f"t_keda_{os.getpid()}"
    app = App(settings=make_settings(pg_dsn, schema))
    app.migrate()
    queries = {}
    for kind, scenario in KINDS.items():
        values = merge(scenario_values(scenario), {"database": {"schema": schema}})
        assert "default" in values["worker"]["queues"]
        scaled = one(documents(render(values)), kind)
        queries[kind] = scaled["spec"]["triggers"][0]["metadata"]["query"]
    yield app, queries
    app.close()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        drop_schema(conn, schema)


def execute(conn, schema: str, statement: str) -> None:
    """Run a statement with {s} standing for the quoted schema."""
    conn.execute(psycopg.sql.SQL(statement).format(s=psycopg.sql.Identifier(schema)))


@pytest.fixture
def env(keda, conn):
    app, queries = keda
    execute(conn, app.settings.schema, "TRUNCATE {s}.jobs, {s}.queues, {s}.queue_events CASCADE")
    return app, queries


def count(conn, query: str) -> int:
    [(n,)] = conn.execute(query).fetchall()
    return n


def running_with_expired_lease(app, conn):
    """A job whose pod died mid-run: claimed under a short lease that then ran out."""
    app.enqueue("t")
    [job] = app.claim("default", lease_seconds=0.2)
    wait_until(lambda: q(conn, app.settings.schema,
                         "SELECT 1 FROM {s}.jobs WHERE id = %s AND state = 'running' AND lease_expires_at < now()",
                         job.id), 10, message="the lease to expire")


def finished(app, conn):
    app.enqueue("t")
    [job] = app.claim("default")
    app.complete(job)


def pending_in_paused_queue(app, conn):
    app.enqueue("t")
    app.pause_queue("default", actor="test")


def running_in_paused_queue(app, conn):
    app.enqueue("t")
    app.claim("default", lease_seconds=300)
    app.pause_queue("default", actor="test")  # running jobs finish: a pod must stay for them


NOTHING_TO_DO = {
    "empty queue": lambda app, conn: None,
    "future-dated job": lambda app, conn: app.enqueue("t", delay=3600),
    "due job in a queue not served": lambda app, conn: app.enqueue("t", queue="not-served"),
    "due job in a paused queue": pending_in_paused_queue,
    "finished job": finished,
}
WORK_FOR_A_POD = {
    "due pending job": lambda app, conn: app.enqueue("t"),
    "running job with a valid lease": lambda app, conn: (app.enqueue("t"), app.claim("default", lease_seconds=300)),
    "running job with an expired lease, nothing pending": running_with_expired_lease,
    "running job in a paused queue": running_in_paused_queue,
}


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("case", sorted(WORK_FOR_A_POD))
def test_the_trigger_counts_work_a_pod_must_start_or_stay_for(env, conn, kind, case):
    app, queries = env
    WORK_FOR_A_POD[case](app, conn)
    assert count(conn, queries[kind]) == 1, queries[kind]


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("case", sorted(NOTHING_TO_DO))
def test_the_trigger_is_zero_when_there_is_nothing_to_do(env, conn, kind, case):
    app, queries = env
    NOTHING_TO_DO[case](app, conn)
    assert count(conn, queries[kind]) == 0, queries[kind]


def test_the_trigger_adds_due_and_running_jobs(env, conn):
    app, queries = env
    app.enqueue_many([("t", i) for i in range(5)])
    app.claim("default", limit=2, lease_seconds=300)
    app.enqueue("t", delay=3600)
    for query in queries.values():
        assert count(conn, query) == 5  # 3 due + 2 running; not the future job


def test_the_trigger_counts_what_the_gauges_call_due_and_running(env, conn):
    """The trigger and pgworker_queue_jobs agree: due (not scheduled, not blocked) plus
    running, the due part dropping out while the queue is paused (pgworker_queue_paused)."""
    app, queries = env
    app.enqueue_many([("t", i) for i in range(5)])
    app.enqueue_many([{"task": "t", "payload": i, "delay": 3600} for i in range(4)])  # scheduled
    app.enqueue("t", ordering_key="k")
    app.enqueue("t", ordering_key="k")  # blocked
    app.claim("default", limit=2, lease_seconds=300)
    [row] = app.store.queue_stats(conn, ["default"])
    assert (row["due"], row["scheduled"], row["blocked"], row["running"]) == (4, 4, 1, 2)
    for query in queries.values():
        assert count(conn, query) == row["due"] + row["running"]
    app.pause_queue("default", actor="test")
    [row] = app.store.queue_stats(conn, ["default"])
    assert row["paused"] and row["due"] == 4
    for query in queries.values():
        assert count(conn, query) == row["running"]


def _scans(plan: dict) -> list[tuple[str, str | None, str | None]]:
    """(node type, relation, index) of every node of an EXPLAIN (FORMAT JSON) plan."""
    out = [(plan["Node Type"], plan.get("Relation Name"), plan.get("Index Name"))]
    for child in plan.get("Plans", []):
        out += _scans(child)
    return out


def test_the_trigger_reads_only_the_partial_indexes(env, conn):
    """With a jobs table as in production (mostly finished rows), every read of jobs is
    an index scan of a partial index; no sequential scan of jobs."""
    app, queries = env
    schema = app.settings.schema
    execute(conn, schema, "INSERT INTO {s}.jobs (queue, task, payload, state, finished_at) "
                          "SELECT 'default', 't', '{{}}', 'succeeded', now() FROM generate_series(1, 100000)")
    app.enqueue_many([("t", i) for i in range(50)])
    app.claim("default", limit=10, lease_seconds=300)
    execute(conn, schema, "ANALYZE {s}.jobs")
    for kind, query in queries.items():
        [(plan,)] = conn.execute("EXPLAIN (FORMAT JSON) " + query).fetchall()
        scans = [s for s in _scans(plan[0]["Plan"]) if s[1] == "jobs"]
        assert scans and all(s[0] != "Seq Scan" for s in scans), (kind, json.dumps(plan))
        assert {s[2] for s in scans if s[2]} <= PARTIAL_INDEXES, (kind, scans)
