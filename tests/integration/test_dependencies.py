"""Job dependencies (issue 21): children wait, blocked, until every parent succeeded; the
statement that completes the last parent makes them due; dead and cancelled parents
follow the child's policy; bad input enqueues nothing."""

from __future__ import annotations

import dataclasses
import threading

import psycopg
import pytest
from psycopg import sql

from pgworker import App, InvalidJob, JobSpec, Permanent, RetryPolicy
from pgworker.testing import drain

pytestmark = pytest.mark.integration
NO_BACKOFF = RetryPolicy(base_seconds=0, max_seconds=0, jitter=0)


def q(conn, schema, text, *args):
    return conn.execute(sql.SQL(text).format(s=sql.Identifier(schema)), args).fetchall()


def state(conn, schema, job_id):
    return q(conn, schema, "SELECT state::text, blocked, waiting_parents, last_error_code FROM {s}.jobs "
                           "WHERE id = %s", job_id)[0]


def count_jobs(conn, schema):
    return q(conn, schema, "SELECT count(*) FROM {s}.jobs")[0][0]


def test_a_child_waits_for_every_parent_and_is_never_claimed_before(app, conn):
    schema = app.settings.schema
    a, b = app.enqueue("t", 1), app.enqueue("t", 2)
    child = app.enqueue("t", 3, depends_on=[a, b, a])  # a duplicate parent counts once
    assert state(conn, schema, child) == ("pending", True, 2, None)
    first = app.claim(limit=10)
    assert sorted(j.id for j in first) == [a, b]  # the child is not claimable
    app.complete(first[0])
    assert state(conn, schema, child)[:3] == ("pending", True, 1)
    assert app.claim(limit=10) == []
    app.complete(first[1])
    assert state(conn, schema, child)[:3] == ("pending", False, 0)
    assert [j.id for j in app.claim(limit=10)] == [child]
    job = app.get_job(child)
    assert [p["id"] for p in job["parents"]] == [a, b] and job["on_parent_failure"] == "hold"
    assert [c["id"] for c in app.get_job(a)["children"]] == [child]


def test_the_completing_statement_unblocks_in_its_own_transaction(app, conn, pg_dsn):
    schema = app.settings.schema
    parent = app.enqueue("t")
    child = app.enqueue("t", depends_on=[parent])
    [job] = app.claim()
    with psycopg.connect(pg_dsn) as tx:  # the caller's transaction (issue 20: completion in a handler's)
        app.complete(job, conn=tx)
        assert state(tx, schema, child)[:2] == ("pending", False)  # inside: due
        assert state(conn, schema, child)[:2] == ("pending", True)  # outside: not yet committed
        tx.rollback()
    assert state(conn, schema, child)[:2] == ("pending", True)  # rolled back with the parent's success
    assert state(conn, schema, parent)[0] == "running"
    app.complete(job)
    assert state(conn, schema, child)[:2] == ("pending", False)


def test_a_parent_that_already_succeeded_does_not_count(app, conn):
    schema = app.settings.schema
    done = app.enqueue("t")
    [j] = app.claim()
    app.complete(j)
    child = app.enqueue("t", depends_on=[done])
    assert state(conn, schema, child)[:3] == ("pending", False, 0)


def test_fan_out_of_1000(app, conn):
    schema = app.settings.schema
    ids = app.enqueue_many([JobSpec("t", "root", ref="root")] +
                           [JobSpec("t", i, depends_on=["root"]) for i in range(1000)])
    root, children = ids[0], ids[1:]
    assert q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE blocked AND waiting_parents = 1")[0][0] == 1000
    assert {r[0] for r in q(conn, schema, "SELECT graph_id FROM {s}.jobs")} == {root}
    [job] = app.claim(limit=50)
    assert job.id == root
    app.complete(job, result={"fan": "out"})
    assert q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE state = 'pending' AND NOT blocked "
                           "AND waiting_parents = 0")[0][0] == 1000
    claimed = app.claim(limit=1000)
    assert sorted(j.id for j in claimed) == children


def test_fan_in_of_1000(app, conn):
    schema = app.settings.schema
    parents = app.enqueue_many([("t", i) for i in range(1000)])
    child = app.enqueue("t", "sink", depends_on=parents)
    jobs = app.claim(limit=1000)
    assert len(jobs) == 1000 and child not in {j.id for j in jobs}
    for k in range(0, 1000, 100):  # batched successes, as the completer writes them
        app.store.complete(conn, [j.lease for j in jobs[k:k + 100]])
        waiting = state(conn, schema, child)
        assert waiting[:3] == (("pending", True, 1000 - k - 100) if k < 900 else ("pending", False, 0))
    assert [j.id for j in app.claim()] == [child]


def test_a_chain_of_100_runs_in_order(app, conn):
    order = []

    @app.task(name="link")
    def link(payload, ctx):
        order.append(payload)
        results = ctx.parent_results()
        return (sum(results.values()) if results else 0) + payload

    ids = app.enqueue_many([JobSpec("link", 0, ref="0")] +
                           [JobSpec("link", i, ref=str(i), depends_on=[str(i - 1)]) for i in range(1, 100)])
    result = drain(app)
    assert order == list(range(100)) and result.succeeded == 100
    assert app.result(ids[-1]) == sum(range(100))  # each link adds its parent's result


def test_a_parent_that_fails_then_succeeds_releases_its_child(app, conn):
    schema = app.settings.schema
    parent = app.enqueue("t", max_attempts=3)
    child = app.enqueue("t", depends_on=[parent])
    [job] = app.claim()
    assert app.fail(job, RuntimeError("transient"), retry=NO_BACKOFF) == "pending"
    assert state(conn, schema, child)[:3] == ("pending", True, 1)  # a retry is not a failure of the parent
    [job] = app.claim()
    assert job.id == parent
    app.complete(job)
    assert [j.id for j in app.claim()] == [child]


def test_a_dead_parent_holds_its_child_until_replayed(app, conn):
    schema = app.settings.schema
    parent = app.enqueue("t", max_attempts=1)
    child = app.enqueue("t", depends_on=[parent])  # hold, the default
    grandchild = app.enqueue("t", depends_on=[child], on_parent_failure="cancel")
    [job] = app.claim()
    app.fail(job, Permanent("broken"))
    assert state(conn, schema, child)[:3] == ("pending", True, 1)
    assert state(conn, schema, grandchild)[:3] == ("pending", True, 1)
    assert app.replay([parent]) == [parent]
    [job] = app.claim()
    app.complete(job)
    [job] = app.claim()
    assert job.id == child
    app.complete(job)
    assert [j.id for j in app.claim()] == [grandchild]


def test_a_dead_parent_cancels_a_cancel_policy_child_and_what_waits_below(app, conn):
    schema = app.settings.schema
    ids = app.enqueue_many([
        JobSpec("t", ref="p", max_attempts=1),
        JobSpec("t", ref="c", depends_on=["p"], on_parent_failure="cancel"),
        JobSpec("t", ref="held", depends_on=["p"]),
        JobSpec("t", ref="g", depends_on=["c"]),  # hold, but its parent is cancelled: cancelled too
        JobSpec("t", ref="gg", depends_on=["g"]),
    ])
    p, c, held, g, gg = ids
    [job] = app.claim()
    app.fail(job, Permanent("no disk"))
    assert state(conn, schema, c) == ("cancelled", True, 1, "PARENT_DEAD")
    assert state(conn, schema, g) == ("cancelled", True, 1, "PARENT_DEAD")
    assert state(conn, schema, gg) == ("cancelled", True, 1, "PARENT_DEAD")
    assert state(conn, schema, held)[:3] == ("pending", True, 1)
    message = app.get_job(c)["errors"][-1]["message"]
    assert f"job {p}" in message and "dead" in message and "PERMANENT" in message
    # replay of the whole graph: the dead parent, and the jobs its death cancelled
    replayed = app.replay_graph(p)
    assert sorted(replayed) == sorted([p, c, g, gg])
    assert {state(conn, schema, i)[:2] for i in (c, g, gg, held)} == {("pending", True)}
    app.task(name="t")(lambda payload: None)
    drain(app)
    assert {state(conn, schema, i)[0] for i in ids} == {"succeeded"}


def test_a_cancelled_parent_cancels_its_children_and_a_graph_cancels_as_one(app, conn):
    schema = app.settings.schema
    ids = app.enqueue_many([JobSpec("t", ref="a"), JobSpec("t", ref="b", depends_on=["a"]),
                            JobSpec("t", depends_on=["b"])])
    app.cancel(ids[0])
    assert [state(conn, schema, i)[::3] for i in ids] == [
        ("cancelled", None), ("cancelled", "PARENT_CANCELLED"), ("cancelled", "PARENT_CANCELLED")]
    other = app.enqueue_many([JobSpec("t", ref="a"), JobSpec("t", depends_on=["a"]),
                              JobSpec("t", depends_on=["a"])])
    [running] = app.claim()
    out = app.cancel_graph(other[0])
    assert out["jobs"] == 3
    assert state(conn, schema, other[0])[0] == "running"  # a cancellation request, carried by the renewal
    assert {state(conn, schema, i)[0] for i in other[1:]} == {"cancelled"}
    assert [j["id"] for j in app.list_jobs(graph_id=other[0])] == sorted(other, reverse=True)


def test_a_graph_cancel_reads_every_page_of_its_jobs(app, conn, monkeypatch):
    """cancel_graph and replay_graph read the graph in keyset pages: a graph larger than a
    page is cancelled whole (it stopped, silently, at the one read's limit)."""
    schema = app.settings.schema
    ids = app.enqueue_many([JobSpec("t", ref="a")] + [JobSpec("t", depends_on=["a"]) for _ in range(24)])
    with app.connection() as c:
        assert [j["id"] for j in app.store.graph_jobs(c, ids[0], page=10)] == ids
    monkeypatch.setattr("pgworker.store.dependencies.GRAPH_PAGE", 10)  # pages of 10 through the public call
    out = app.cancel_graph(ids[0])
    assert out["jobs"] == 25
    assert {state(conn, schema, i)[0] for i in ids} == {"cancelled"}


def test_a_graph_with_more_dead_jobs_than_one_replay_takes_is_replayed_whole(app, conn):
    """replay_graph puts back every dead job of the graph, in chunks of REPLAY_CHUNK (one
    replay each): 1,001 dead jobs all go back (it stopped, silently, at 1,000)."""
    schema = app.settings.schema
    ids = app.enqueue_many([JobSpec("t", ref="root")] + [JobSpec("t", depends_on=["root"]) for _ in range(1001)])
    [root] = app.claim()
    app.complete(root)
    dead: list[int] = []
    while len(dead) < 1001:
        batch = app.claim(limit=100)
        assert batch, "every child is claimable once its parent succeeded"
        for job in batch:
            assert app.fail(job, Permanent("no disk")) == "dead"
            dead.append(job.id)
    replayed = app.replay_graph(ids[0])
    assert sorted(replayed) == sorted(ids[1:]) == sorted(replayed.replayed)
    assert q_states(conn, schema, ids[1:]) == {"pending": 1001} and replayed.held_by == {}


def q_states(conn, schema, ids):
    rows = conn.execute(sql.SQL("SELECT state::text, count(*) FROM {}.jobs WHERE id = ANY(%s) GROUP BY 1")
                        .format(sql.Identifier(schema)), (ids,)).fetchall()
    return dict(rows)


def test_bad_input_is_refused_and_enqueues_nothing(app, conn, pg_dsn):
    schema = app.settings.schema
    parent = app.enqueue("t")
    before = count_jobs(conn, schema)
    other = App(settings=dataclasses.replace(app.settings, schema=schema + "_o"))
    other.migrate()
    try:
        foreign = other.enqueue("t")
        cases = [
            (lambda: app.enqueue("t", depends_on=[parent, 10**12]), "do not exist"),
            (lambda: app.enqueue("t", depends_on=[foreign + 10**6]), "do not exist"),
            (lambda: app.enqueue("t", depends_on=list(range(1, 1002))), "max_parents (1000)"),
            (lambda: app.enqueue("t", depends_on=[parent], dedupe_key="k"), "dedupe_key"),
            (lambda: app.enqueue("t", depends_on=[parent], ordering_key="k"), "ordering_key"),
            (lambda: app.enqueue("t", depends_on=parent), "list"),
            (lambda: app.enqueue("t", depends_on={parent: 1}), "list or tuple of job ids (or refs), got a dict"),
            (lambda: app.enqueue("t", depends_on={parent}), "got a set"),
            (lambda: app.enqueue_many([JobSpec("t", depends_on={parent: 1})]), "got a dict"),
            (lambda: app.enqueue("t", depends_on=[2**70]), "no job can have"),
            (lambda: app.chain([]), "at least one job"),
            (lambda: app.group([]), "at least one job"),
            (lambda: app.enqueue("t", depends_on=[parent], on_parent_failure="ignore"), "'hold' or 'cancel'"),
            (lambda: app.enqueue_many([JobSpec("t", depends_on=["later"]), JobSpec("t", ref="later")]),
             "earlier job"),
            (lambda: app.enqueue_many([JobSpec("t", ref="x"), JobSpec("t", ref="x")]), "two jobs"),
            # a job id as text reads as a ref: the message says how to give an id (a trial)
            (lambda: app.enqueue("t", depends_on=[str(parent)]), f"a job id is an int: depends_on=[{parent}]"),
            (lambda: app.enqueue("t", on_parent_failure="cancel"), "this job has none: give depends_on=[...] too"),
            (lambda: app.enqueue("t", depends_on=None, on_parent_failure="hold"), "give depends_on=[...] too"),
            (lambda: app.enqueue_many([JobSpec("t", ref="x"), JobSpec("t", depends_on=["x", 10**12])]),
             "do not exist"),
        ]
        for call, text in cases:
            with pytest.raises(InvalidJob) as info:
                call()
            assert text in str(info.value)
            assert count_jobs(conn, schema) == before
        assert q(conn, schema, "SELECT count(*) FROM {s}.job_dependencies")[0][0] == 0
        # a list of parents built at run time may be empty, with its policy (a break-it trial)
        assert app.get_job(app.enqueue("t", depends_on=[], on_parent_failure="cancel"))["state"] == "pending"
        before += 1
        # a parent that can never succeed
        app.cancel(parent)
        with pytest.raises(InvalidJob, match="cancelled"):
            app.enqueue("t", depends_on=[parent])
        assert count_jobs(conn, schema) == before
    finally:
        other.close()
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            from pgworker.migrate import drop_schema
            drop_schema(c, schema + "_o")


def test_a_pruned_parent_never_leaves_its_child_blocked(app, conn):
    """The rule: a parent deleted before it succeeded (retention of dead jobs, a delete by
    hand) cancels the children still waiting for it, PARENT_PRUNED; a parent deleted after
    it succeeded was counted already and changes nothing."""
    schema = app.settings.schema
    dead_parent = app.enqueue("t", max_attempts=1)
    ok_parent = app.enqueue("t")
    waiting = app.enqueue("t", depends_on=[dead_parent])
    below = app.enqueue("t", depends_on=[waiting])
    released = app.enqueue("t", depends_on=[ok_parent])
    jobs = {j.id: j for j in app.claim(limit=2)}
    app.fail(jobs[dead_parent], Permanent("gone"))
    app.complete(jobs[ok_parent])
    counts = app.store.prune(conn, succeeded_seconds=0, cancelled_seconds=None, dead_seconds=0, limit=100)
    assert counts["dead"] == 1 and counts["succeeded"] == 1
    assert state(conn, schema, waiting) == ("cancelled", True, 1, "PARENT_PRUNED")
    assert state(conn, schema, below)[::3] == ("cancelled", "PARENT_CANCELLED")
    assert state(conn, schema, released)[:3] == ("pending", False, 0)
    assert q(conn, schema, "SELECT count(*) FROM {s}.job_dependencies WHERE parent_id = ANY(%s)",
             [dead_parent, ok_parent])[0][0] == 0


def test_two_parents_completing_at_once_unblock_the_child_once(app, conn, pg_dsn):
    schema = app.settings.schema
    for _ in range(20):
        a, b = app.enqueue("t"), app.enqueue("t")
        child = app.enqueue("t", depends_on=[a, b])
        jobs = {j.id: j for j in app.claim(limit=2)}
        barrier = threading.Barrier(2)
        errors = []

        def finish(job):
            try:
                with psycopg.connect(pg_dsn, autocommit=True) as c:
                    barrier.wait()
                    assert app.store.complete(c, [job.lease]).ok
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=finish, args=(jobs[i],)) for i in (a, b)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert not errors
        assert state(conn, schema, child)[:3] == ("pending", False, 0)
        [job] = app.claim()
        assert job.id == child
        app.complete(job)


def test_a_worker_role_completes_a_parent_through_the_trigger(app, conn, pg_dsn):
    from pgworker.grants import grant_statements

    schema = app.settings.schema
    roles = {k: f"r21d_{k}_{schema[-12:]}" for k in ("producer", "worker")}
    try:
        for r in roles.values():
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(r)))
        for statement in grant_statements(schema, **roles):
            conn.execute(statement)
        dsn = {k: psycopg.conninfo.make_conninfo(pg_dsn, user=r) for k, r in roles.items()}
        producer = App(settings=dataclasses.replace(app.settings, dsn=dsn["producer"]))
        worker = App(settings=dataclasses.replace(app.settings, dsn=dsn["worker"]))
        try:
            ids = producer.enqueue_many([JobSpec("t", ref="p"), JobSpec("t", depends_on=["p"])])
            late = producer.enqueue("t", depends_on=[ids[0]])
            [job] = worker.claim()
            worker.complete(job, result=1)
            assert {state(conn, schema, i)[:2] for i in (ids[1], late)} == {("pending", False)}
        finally:
            producer.close()
            worker.close()
    finally:
        for r in roles.values():
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(r)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(r)))


def test_jobs_show_prints_parents_children_and_result_and_the_listing_filters_by_graph(app, pg_dsn, capsys):
    from pgworker.cli import main

    graph = app.group([("t", 1), ("t", 2)], callback=("t", "sum"))
    jobs = {j.id: j for j in app.claim(limit=2)}
    first = jobs[graph.ids[0]]
    app.complete(first, result={"part": 1})
    schema = app.settings.schema
    capsys.readouterr()
    assert main(["jobs", "show", str(graph.ids[-1]), "--dsn", pg_dsn, "--schema", schema]) == 0
    out = capsys.readouterr().out
    assert f"{graph.ids[0]} (t): succeeded" in out and f"{graph.ids[1]} (t): running" in out
    assert "waiting_parents  1" in out and f"graph_id  {graph.graph_id}" in out.replace("   ", " ").replace("  graph", "graph")
    assert main(["jobs", "show", str(graph.ids[0]), "--dsn", pg_dsn, "--schema", schema]) == 0
    out = capsys.readouterr().out
    assert f"{graph.ids[-1]} (t): pending, waiting for 1" in out and '"part": 1' in out
    app.enqueue("t")  # not in the graph
    assert main(["jobs", "list", "--graph", str(graph.graph_id), "--dsn", pg_dsn, "--schema", schema,
                 "--json"]) == 0
    listed = __import__("json").loads(capsys.readouterr().out)
    assert sorted(r["id"] for r in listed) == sorted(graph.ids)
    # the table says why a pending job is not claimed (its run_at reads as due)
    assert main(["jobs", "list", "--graph", str(graph.graph_id), "--dsn", pg_dsn, "--schema", schema]) == 0
    table = capsys.readouterr().out
    assert "pending (waits for 1 parent)" in table, table


def test_a_group_callback_gets_every_result(app):
    @app.task(name="part")
    def part(payload):
        return payload * 10

    @app.task(name="total")
    def total(payload, ctx):
        return sum(ctx.parent_results().values())

    graph = app.group([("part", i) for i in range(5)], callback=("total", None))
    chained = app.chain([("part", 1), ("total", None), ("total", None)])
    drain(app)
    assert app.result(graph.ids[-1]) == 100
    assert app.result(chained.ids[-1]) == 10
    assert {j["id"] for j in app.list_jobs(graph_id=graph.graph_id)} == set(graph.ids)


def test_the_statistics_count_waiting_jobs_and_the_wait_behind_a_dead_parent(app, conn):
    parent = app.enqueue("t", max_attempts=1, queue="etl")
    live = app.enqueue("t", queue="etl")
    for _ in range(3):
        app.enqueue("t", queue="etl", depends_on=[parent, live])
    [row] = app.store.queue_stats(conn, ["etl"])
    assert row["waiting_on_parents"] == 3 and row["blocked_by_dead_parent_age_seconds"] == 0
    jobs = {j.id: j for j in app.claim("etl", limit=2)}
    app.fail(jobs[parent], Permanent("x"))
    conn.execute(sql.SQL("UPDATE {} SET finished_at = now() - interval '2 hours' WHERE id = %s")
                 .format(sql.Identifier(app.settings.schema, "jobs")), [parent])
    [row] = app.store.queue_stats(conn, ["etl"])
    assert row["waiting_on_parents"] == 3 and 7100 < row["blocked_by_dead_parent_age_seconds"] < 7300
    from pgworker.database_gauges import QueueStatsCollector

    collector = QueueStatsCollector(lambda qs: app.store.queue_stats(conn, qs), lambda: ["etl"], 0)
    families = {f.name: f for f in collector.collect()}
    assert families["pgworker_queue_waiting_on_parents"].samples[0].value == 3
    assert families["pgworker_queue_blocked_by_dead_parent_age_seconds"].samples[0].value > 7100


def test_the_async_producer_builds_the_graph_it_once_refused(app, conn):
    """aenqueue_many with refs (refused before: the async path had no graph enqueue) now
    writes the same rows as enqueue_many (tests/integration/test_async_graphs.py has more)."""
    import asyncio

    async def main():
        try:
            return await app.aenqueue_many([JobSpec("t", ref="a"), JobSpec("t", depends_on=["a"])])
        finally:
            await app.aclose()

    a, b = asyncio.run(main())
    assert state(conn, app.settings.schema, b) == ("pending", True, 1, None)
    assert q(conn, app.settings.schema, "SELECT parent_id, child_id FROM {s}.job_dependencies") == [(a, b)]


def test_graph_id_must_name_an_existing_graph(app, conn):
    """graph_id= joins a job to a graph that exists (some job carries the id); a made-up,
    mistyped or pruned graph id is refused and nothing is enqueued."""
    schema = app.settings.schema
    app.task(name="g")(lambda payload: None)
    graph = app.chain([("g", 1), ("g", 2)])
    joined = app.enqueue("g", 3, graph_id=graph.graph_id)
    assert {j["id"] for j in app.list_jobs(graph_id=graph.graph_id)} == {*graph.ids, joined}
    before = q(conn, schema, "SELECT count(*) FROM {s}.jobs")[0][0]
    for bad in (987654321, joined):  # no such id; a job that is not a graph's first (no job carries it)
        with pytest.raises(InvalidJob, match=f"graph_id names no graph in schema {schema!r}: {bad}"):
            app.enqueue("g", 4, graph_id=bad)
        with pytest.raises(InvalidJob, match="nothing was enqueued"):
            app.enqueue_many([JobSpec("g", 5, ref="a"),
                              JobSpec("g", 6, depends_on=["a"], graph_id=bad)])
    # the refusal names the options given: graph_id with an ordering key, no depends_on
    with pytest.raises(InvalidJob, match="^graph_id cannot be combined with ordering_key "):
        app.enqueue("g", 4, graph_id=graph.graph_id, ordering_key="k")
    with pytest.raises(InvalidJob, match="^depends_on and graph_id cannot be combined with dedupe_key and "
                                         "ordering_key "):
        app.enqueue("g", 4, depends_on=[graph.ids[0]], graph_id=graph.graph_id, dedupe_key="d", ordering_key="k")
    for bad in (0, -1, 2**63):
        with pytest.raises(InvalidJob, match="is no job id"):
            app.enqueue("g", 7, graph_id=bad)
    assert q(conn, schema, "SELECT count(*) FROM {s}.jobs")[0][0] == before
    conn.execute(sql.SQL("DELETE FROM {}.jobs WHERE graph_id = %s").format(sql.Identifier(schema)), (graph.graph_id,))
    with pytest.raises(InvalidJob, match="graph_id names no graph"):  # pruned: gone with its jobs
        app.enqueue("g", 8, graph_id=graph.graph_id)


def _plain_dead_shape(app):
    """The shape of docs/graphs.md's first example, linked by depends_on only (no graph id):
    a parent that dies, a cancel-policy child, a grandchild (hold) below it."""
    p = app.enqueue("t", max_attempts=1)
    c = app.enqueue("t", depends_on=[p], on_parent_failure="cancel")
    gc = app.enqueue("t", depends_on=[c])
    [job] = app.claim()
    app.fail(job, Permanent("no disk"))
    return p, c, gc


@pytest.mark.parametrize("how", ["replay", "areplay", "cli"])
def test_replaying_a_dead_parent_brings_back_what_its_death_cancelled(app, conn, pg_dsn, capsys, how):
    """Jobs linked only by depends_on carry no graph id: replay_graph cannot reach them, so
    every replay of the dead parent requeues what its death cancelled, layer by layer."""
    import asyncio

    from pgworker.cli import main

    schema = app.settings.schema
    p, c, gc = _plain_dead_shape(app)
    assert [state(conn, schema, i)[::3] for i in (c, gc)] == [("cancelled", "PARENT_DEAD")] * 2
    assert q(conn, schema, "SELECT graph_id FROM {s}.jobs WHERE id = %s", c) == [(None,)]
    if how == "replay":
        result = app.replay([p], actor="alice")
        assert result == [p] and sorted(result.requeued) == [c, gc]
    elif how == "areplay":
        result = asyncio.run(app.areplay([p], actor="alice"))
        assert result == [p] and sorted(result.requeued) == [c, gc]
    else:
        capsys.readouterr()
        assert main(["dead", "replay", str(p), "--dsn", pg_dsn, "--schema", schema]) == 0
        out = capsys.readouterr().out
        assert "replayed 1 job" in out and "2 children cancelled by their death wait again" in out
    assert state(conn, schema, c) == ("pending", True, 1, None)
    assert state(conn, schema, gc) == ("pending", True, 1, None)
    events = q(conn, schema, "SELECT job_id, kind, detail->>'cancelled_by' FROM {s}.job_events "
                             "WHERE job_id = ANY(%s) ORDER BY job_id", [c, gc])
    assert events == [(c, "replayed", "PARENT_DEAD"), (gc, "replayed", "PARENT_DEAD")]
    if how != "cli":
        assert q(conn, schema, "SELECT DISTINCT actor FROM {s}.job_events WHERE job_id = ANY(%s)",
                 [c, gc]) == [("alice",)]
    app.task(name="t")(lambda payload: None)
    drain(app)
    assert {state(conn, schema, i)[0] for i in (p, c, gc)} == {"succeeded"}


def test_a_child_with_another_dead_parent_stays_cancelled_until_that_one_is_replayed(app, conn):
    schema = app.settings.schema
    # a job whose other parent was cancelled (not dead) is never brought back by a replay
    d, e = app.enqueue("t", max_attempts=1), app.enqueue("t")
    f = app.enqueue("t", depends_on=[d, e], on_parent_failure="cancel")
    [job] = app.claim()
    assert job.id == d
    app.fail(job, Permanent("broken"))
    assert app.cancel(e) == "cancelled"
    assert app.replay([d]).requeued == []
    assert state(conn, schema, f)[0] == "cancelled"
    app.cancel(d)
    a, b = app.enqueue("t", max_attempts=1), app.enqueue("t", max_attempts=1)
    child = app.enqueue("t", depends_on=[a, b], on_parent_failure="cancel")
    for job in app.claim(limit=2):
        app.fail(job, Permanent("broken"))
    assert state(conn, schema, child)[::3] == ("cancelled", "PARENT_DEAD")
    assert app.replay([a]).requeued == []  # b is still dead: it would wait behind a dead parent
    assert state(conn, schema, child)[::3] == ("cancelled", "PARENT_DEAD")
    assert app.replay([b]).requeued == [child]
    assert state(conn, schema, child) == ("pending", True, 2, None)


def test_a_replay_requeues_a_wide_layer_in_batches(app, conn, monkeypatch):
    schema = app.settings.schema
    monkeypatch.setattr("pgworker.store.dependencies.REQUEUE_BATCH", 3)
    p = app.enqueue("t", max_attempts=1)
    children = [app.enqueue("t", depends_on=[p], on_parent_failure="cancel") for _ in range(7)]
    below = app.enqueue("t", depends_on=children[-1:])
    [job] = app.claim()
    app.fail(job, Permanent("broken"))
    result = app.replay([p])
    assert sorted(result.requeued) == sorted(children + [below])
    assert {state(conn, schema, i)[0] for i in children + [below]} == {"pending"}


def test_batches_completing_parents_with_shared_children_never_deadlock(app, conn, pg_dsn):
    """Two batched successes whose parents share children lock the children in one order
    (job_complete's children_locked), not parent by parent as the trigger meets them.
    The old order deadlocked here for certain: batch 1 locked X (through A), then waited
    on Z (through E; held by a third session); batch 2 locked Y (through C) and waited on
    X; freed, batch 1 went on to Y (through B): a cycle, DeadlockDetected (in a worker,
    a batch whose leases expired unrenewed while it waited, and the reaper killed them)."""
    schema = app.settings.schema
    a, e, b, c, d = (app.enqueue("t") for _ in range(5))
    x = app.enqueue("t", depends_on=[a, d])
    y = app.enqueue("t", depends_on=[b, c])
    z = app.enqueue("t", depends_on=[e])
    jobs = {j.id: j for j in app.claim(limit=5)}
    assert set(jobs) == {a, e, b, c, d}
    def finish(c, ids):
        assert app.store.complete(c, [jobs[i].lease for i in ids]).ok

    errors = _race_behind_a_row_lock(conn, pg_dsn, schema, z, (finish, [a, e, b]), (finish, [c, d]))
    assert not errors, errors
    assert {i: state(conn, schema, i)[:3] for i in (x, y, z)} == {i: ("pending", False, 0) for i in (x, y, z)}


def test_two_cancels_whose_descendants_overlap_never_deadlock(app, conn, pg_dsn):
    """The dependency trigger's cancel (and dead) path cancels a parent's waiting
    descendants in one statement; it once locked them in the order its recursive scan met
    them, level by level. Two sessions cancelling two parents of one fan-in graph then met
    the shared descendants in opposite orders: cancelling P1 locked C1 (level 0), waited
    on E1 (level 1; held by a third session), then went on to C2 (level 2); cancelling P2
    had locked C2 (level 0) and waited on C1 (level 1, through F2): DeadlockDetected. The
    trigger now locks every doomed descendant in id order first."""
    schema = app.settings.schema
    p1, p2 = app.enqueue("t"), app.enqueue("t")
    f2 = app.enqueue("t", depends_on=[p2])
    c1 = app.enqueue("t", depends_on=[p1, f2])
    e1 = app.enqueue("t", depends_on=[c1])
    c2 = app.enqueue("t", depends_on=[e1, p2])
    def cancel(c, parent):
        q(c, schema, "UPDATE {s}.jobs SET state = 'cancelled', finished_at = now(), "
                     "last_error_code = 'CANCELLED' WHERE id = %s RETURNING id", parent)

    errors = _race_behind_a_row_lock(conn, pg_dsn, schema, e1, (cancel, p1), (cancel, p2))
    assert not errors, errors
    assert {i: state(conn, schema, i)[0] for i in (f2, c1, e1, c2)} == dict.fromkeys((f2, c1, e1, c2), "cancelled")


def _race_behind_a_row_lock(conn, pg_dsn, schema, locked_id, first, second) -> list[BaseException]:
    """Two sessions racing through rows another session holds: a third locks row
    ``locked_id``; ``first`` = (fn, arg) runs fn(session, arg) in a thread until it waits
    for that lock, then ``second`` does the same in another; the third commits and both
    finish. Plans are pinned to index scans so each statement meets the rows in the order
    it would in a worker under load. Returns what the two raised (a deadlock, say)."""
    errors: list[BaseException] = []

    def run(c, fn, arg):
        try:
            fn(c, arg)
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            errors.append(exc)

    def waiting(c):
        for _ in range(250):
            if q(conn, schema, "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                 c.info.backend_pid) == [("Lock",)]:
                return
            threading.Event().wait(0.02)
        raise AssertionError("the statement never waited for the row lock")

    with psycopg.connect(pg_dsn) as holder, \
            psycopg.connect(pg_dsn, autocommit=True) as s1, psycopg.connect(pg_dsn, autocommit=True) as s2:
        for session in (s1, s2):
            session.execute("SET enable_seqscan = off; SET enable_bitmapscan = off; "
                            "SET enable_hashjoin = off; SET enable_mergejoin = off")
        q(holder, schema, "SELECT 1 FROM {s}.jobs WHERE id = %s FOR NO KEY UPDATE", locked_id)
        threads = []
        for session, (fn, arg) in ((s1, first), (s2, second)):
            threads.append(threading.Thread(target=run, args=(session, fn, arg)))
            threads[-1].start()
            waiting(session)
        holder.commit()
        for t in threads:
            t.join(10)
    return errors
