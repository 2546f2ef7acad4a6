"""Every statement behind a console page reads an index that exists, on a large table:
no sequential scan of jobs, whatever the filter (issue 24: the console adds no index to
jobs; a filter no index serves is a bounded primary-key window)."""

from __future__ import annotations

import json

import pytest
from psycopg import sql

pytestmark = pytest.mark.integration

NEWEST = 2**63 - 1
EPOCH = "1970-01-01T00:00:00+00:00"
FAR = "9999-01-01T00:00:00+00:00"


@pytest.fixture(scope="module")
def big(pg_dsn):
    """200,000 succeeded jobs over a day, 30,000 pending (some later), 300 running and
    5,000 dead in three queues, 40 graphs of 100 jobs, analysed. Module-scoped: building it is the slow part."""
    import os

    import psycopg

    from pgworker import App
    from pgworker.migrate import drop_schema
    from pg import make_settings

    schema = f"plans_{os.getpid()}"
    app = App(settings=make_settings(pg_dsn, schema))
    app.migrate()
    ident = sql.Identifier(schema)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(sql.SQL(
            "INSERT INTO {}.jobs (queue, task, payload, state, finished_at, created_at) "
            "SELECT 'q' || (i % 3), 't' || (i % 20), jsonb_build_object('user', i % 1000, 'kind', 'k' || (i % 7)), "
            "'succeeded', now() - (i % 86400) * interval '1 second', now() - (i % 86400) * interval '1 second' "
            "FROM generate_series(1, 200000) AS i").format(ident))
        c.execute(sql.SQL(
            "INSERT INTO {}.jobs (queue, task, payload, run_at) "
            "SELECT 'q' || (i % 3), 't' || (i % 20), jsonb_build_object('user', i % 1000), "
            "now() + (CASE WHEN i % 4 = 0 THEN 3600 ELSE -(i % 600) END) * interval '1 second' "
            "FROM generate_series(1, 30000) AS i").format(ident))
        c.execute(sql.SQL(
            "INSERT INTO {}.jobs (queue, task, payload, state, lease_expires_at, lease_owner, lease_token, attempts) "
            "SELECT 'q' || (i % 3), 't1', '{{}}', 'running', now() + interval '60 seconds', 'w', 1, 1 "
            "FROM generate_series(1, 300) AS i").format(ident))
        c.execute(sql.SQL(
            "INSERT INTO {}.jobs (queue, task, payload, state, finished_at, last_error_code, attempts) "
            "SELECT 'q' || (i % 3), 't' || (i % 5), jsonb_build_object('user', i), 'dead', "
            "now() - (i % 3600) * interval '1 second', 'E' || (i % 4), 5 FROM generate_series(1, 5000) AS i").format(ident))
        c.execute(sql.SQL(  # 40 graphs of 100 jobs (graph ids 1000 to 1039), some dead
            "INSERT INTO {}.jobs (queue, task, payload, state, finished_at, graph_id) "
            "SELECT 'q' || (i % 3), 't' || (i % 5), jsonb_build_object('user', i), "
            "CASE WHEN i % 10 = 0 THEN 'dead' ELSE 'succeeded' END::{}.job_state, now(), 1000 + i % 40 "
            "FROM generate_series(1, 4000) AS i").format(ident, ident))
        c.execute(sql.SQL("VACUUM ANALYZE {}.jobs").format(ident))
    yield app
    app.close()
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        drop_schema(c, schema)


def _plan(conn, app, name, params, generic=False):
    if generic:
        conn.execute("SET plan_cache_mode = force_generic_plan")
    try:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(app.settings.schema)))
        return conn.execute("EXPLAIN (FORMAT JSON) " + app.store.queries[name], params).fetchone()[0]
    finally:
        conn.execute("RESET plan_cache_mode")
        conn.execute("RESET search_path")


def _nodes(plan):
    if isinstance(plan, list):
        for item in plan:
            yield from _nodes(item)
    elif isinstance(plan, dict):
        if "Node Type" in plan:
            yield plan
        for value in plan.values():
            if isinstance(value, (list, dict)):
                yield from _nodes(value)


def _jobs_scans(plan):
    """Scans of jobs: by relation, or a bitmap index scan of one of its indexes (whose node
    names the index only)."""
    return [n for n in _nodes(plan)
            if n.get("Relation Name") == "jobs" or str(n.get("Index Name", "")).startswith("jobs_")]


def _indexes(plan):
    return {n["Index Name"] for n in _jobs_scans(plan) if n.get("Index Name")}


def _assert_indexed(plan, *indexes):
    scans = _jobs_scans(plan)
    seq = [n for n in scans if n["Node Type"] == "Seq Scan"]
    assert not seq, json.dumps(plan, indent=1)[:4000]
    used = {n.get("Index Name") for n in scans if n.get("Index Name")}
    for index in indexes:
        assert index in used, (index, used)


def test_the_overview_reads_partial_indexes_only(big, conn):
    names = _plan(conn, big, "console_queue_names", {"limit": 500})
    _assert_indexed(names, "jobs_dead_idx")
    assert _indexes(names) <= {"jobs_due_idx", "jobs_claim_idx", "jobs_running_idx",
                                                                 "jobs_dead_idx"}
    overview = _plan(conn, big, "console_queue_overview", {"queues": ["q0", "q1", "q2"], "cap": 10_000})
    _assert_indexed(overview, "jobs_dead_idx", "jobs_running_idx")
    assert _indexes(overview) & {"jobs_due_idx", "jobs_claim_idx"}
    throughput = _plan(conn, big, "console_throughput", {"limit": 50_000})
    _assert_indexed(throughput, "jobs_finished_idx")
    estimate = _plan(conn, big, "console_jobs_estimate", {"schema": big.settings.schema})
    assert not _jobs_scans(estimate)


@pytest.mark.parametrize("job_filter", [
    {}, {"payload": {"user": 7}}, {"task": "t3"}, {"state": "dead"}, {"error_code": "E1", "queue": "q1"},
    {"created_after": "2026-01-01T00:00:00+00:00", "created_before": "2027-01-01T00:00:00+00:00"},
    {"ordering_key": "k"}, {"dedupe_key": "d"}, {"state": "pending", "payload": {"kind": "k3"}},
])
@pytest.mark.parametrize("generic", [False, True])
def test_the_jobs_window_is_a_primary_key_range_whatever_the_filter(big, conn, job_filter, generic):
    plan = _plan(conn, big, "console_jobs_window", {"filter": json.dumps(job_filter), "before": NEWEST,
                                                    "scan": 50_000, "limit": 51}, generic=generic)
    _assert_indexed(plan, "jobs_pkey")
    assert _indexes(plan) == {"jobs_pkey"}


@pytest.mark.parametrize("job_filter", [
    {}, {"state": "dead"}, {"task": "t3", "queue": "q1"}, {"payload": {"user": 7}},
    {"created_after": "2026-01-01T00:00:00+00:00"},
])
@pytest.mark.parametrize("generic", [False, True])
def test_the_jobs_list_of_a_graph_walks_jobs_graph_idx(big, conn, job_filter, generic):
    """`/jobs?graph=ID`: the window is the graph's newest jobs, read from jobs_graph_idx
    (graph_id, id), whatever else the filter holds; never the table's primary key."""
    plan = _plan(conn, big, "console_jobs_graph_window", {
        "filter": json.dumps({**job_filter, "graph": 1007}), "graph": 1007, "before": NEWEST, "scan": 50_000,
        "limit": 51}, generic=generic)
    _assert_indexed(plan, "jobs_graph_idx")
    assert _indexes(plan) == {"jobs_graph_idx"}, json.dumps(plan, indent=1)[:4000]


def test_the_index_ordered_lists_walk_their_index(big, conn):
    due = _plan(conn, big, "console_jobs_due", {"queue": "q1", "after_run_at": EPOCH, "after_id": 0, "limit": 51})
    _assert_indexed(due)
    assert _indexes(due) & {"jobs_due_idx", "jobs_claim_idx"}
    for queue in (None, "q2"):
        running = _plan(conn, big, "console_jobs_running", {"queue": queue, "after_at": EPOCH, "after_id": 0,
                                                            "limit": 51})
        _assert_indexed(running)
        assert _indexes(running) == {"jobs_running_idx"}
    for state in ("succeeded", "cancelled", "dead"):
        finished = _plan(conn, big, "console_jobs_finished", {"state": state, "before_at": FAR, "before_id": NEWEST,
                                                              "limit": 51})
        _assert_indexed(finished, "jobs_finished_idx")
    dead = _plan(conn, big, "console_jobs_dead_in_queue", {"queue": "q0", "before_at": FAR, "before_id": NEWEST,
                                                           "limit": 51})
    _assert_indexed(dead, "jobs_dead_idx")
    tail = _plan(conn, big, "console_job_tail", None)
    _assert_indexed(tail, "jobs_pkey")


def test_the_dead_jobs_page_reads_the_dead_set_only(big, conn):
    for queue, index in ((None, "jobs_finished_idx"), ("q1", "jobs_dead_idx")):
        groups = _plan(conn, big, "console_dead_groups", {"queue": queue, "scan": 100_000, "limit": 200})
        _assert_indexed(groups)
        assert _indexes(groups) & {"jobs_finished_idx", "jobs_dead_idx"}
        jobs = _plan(conn, big, "console_dead_group_jobs", {"queue": queue, "task": "t1", "error_code": "E1",
                                                            "before_at": FAR, "before_id": NEWEST, "scan": 100_000,
                                                            "limit": 51})
        _assert_indexed(jobs, index)
        count = _plan(conn, big, "console_dead_count", {"queue": queue, "task": "t1", "error_code": "E1",
                                                        "cap": 1_000_000})
        _assert_indexed(count)
        assert _indexes(count) & {"jobs_finished_idx", "jobs_dead_idx"}


def test_a_bulk_batch_and_the_actions_are_primary_key_reads(big, conn):
    batch = _plan(conn, big, "bulk_operation_candidates", {"filter": json.dumps({"state": "dead", "task": "t1"}),
                                                           "after": 0, "max_id": NEWEST, "limit": 500})
    _assert_indexed(batch, "jobs_pkey")
    for generic in (False, True):  # a bulk replay of a graph's dead jobs reads the graph's jobs only
        graph = _plan(conn, big, "bulk_operation_candidates_graph", {
            "filter": json.dumps({"state": "dead", "graph": 1007}), "graph": 1007, "after": 0, "max_id": NEWEST,
            "limit": 500}, generic=generic)
        assert _indexes(graph) == {"jobs_graph_idx"}, json.dumps(graph, indent=1)[:4000]
        _assert_indexed(graph, "jobs_graph_idx")
    retry = _plan(conn, big, "job_retry_now", {"id": 5, "actor": "a", "channel": "c"})
    _assert_indexed(retry, "jobs_pkey")
    create = _plan(conn, big, "bulk_operation_create", {"kind": "replay", "filter": "{}", "actor": "a",
                                                        "expected": None, "batch_size": 500, "reason": None})
    _assert_indexed(create, "jobs_pkey")
