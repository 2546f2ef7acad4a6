"""Results and dependencies (issue 21) through real `pgworker run` processes: what handlers return is
stored by the claimers' batched success and read back by a waiting producer."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from pg import wait_until
from pgworker import JobSpec
from worker import Worker, q

pytestmark = pytest.mark.acceptance


def test_a_workers_results_reach_a_waiting_producer(env, pg_dsn, conn):
    schema = env.settings.schema
    ids = env.enqueue_many([("returns", {"i": i}) for i in range(50)])
    nothing = env.enqueue("record", 1)
    with Worker(pg_dsn, schema, "--concurrency", "2"):
        t0 = time.monotonic()
        got = [env.wait_result(job_id, timeout=60) for job_id in ids]
        assert env.wait_result(nothing, timeout=60) is None
        elapsed = time.monotonic() - t0
    assert got == [{"echo": {"i": i}, "attempt": 1} for i in range(50)]
    assert elapsed < 30
    assert q(conn, schema, "SELECT count(*) FROM {s}.job_results")[0][0] == 50


def _graph_rows(conn, schema, ids):
    return q(conn, schema, "SELECT id, state::text, waiting_parents, started_at, finished_at, attempts "
                           "FROM {s}.jobs WHERE id = ANY(%s)", list(ids))


def _check_children_ran_after_their_parents(conn, schema, graphs):
    """Every child succeeded, ran (each run recorded) only after all its parents succeeded,
    never more often than its attempts, and saw every parent's result."""
    for parents, child in graphs:
        rows = {r[0]: r for r in _graph_rows(conn, schema, [*parents, child])}
        assert {rows[p][1] for p in parents} == {"succeeded"}
        assert rows[child][1] == "succeeded" and rows[child][2] == 0
        runs = q(conn, schema, "SELECT at, note FROM {s}.ledger WHERE job_id = %s AND event = 'run'", child)
        assert 1 <= len(runs) <= rows[child][5]
        last_parent = max(rows[p][4] for p in parents)
        assert all(at >= last_parent for at, _ in runs)
        assert sorted(int(x) for x in runs[-1][1].split(",")) == sorted(parents)


def test_two_pods_complete_parents_at_once_and_each_child_runs_once(env, pg_dsn, conn):
    """Fan-in graphs whose parents finish at the same moment in two pods: each child is
    unblocked once (its counter never goes below 0: a CHECK constraint) and runs once."""
    schema = env.settings.schema
    graphs = []
    for g in range(40):
        ids = env.enqueue_many([JobSpec("sturdy", {"seconds": 0.05}, ref="a"),
                                JobSpec("sturdy", {"seconds": 0.05}, ref="b"),
                                JobSpec("sturdy", {"seconds": 0.05}, ref="c"),
                                JobSpec("sink", None, depends_on=["a", "b", "c"])])
        graphs.append((ids[:3], ids[3]))
    with Worker(pg_dsn, schema, "--concurrency", "3", "--batch-size", "1", name="pod-a"), \
            Worker(pg_dsn, schema, "--concurrency", "3", "--batch-size", "1", name="pod-b"):
        wait_until(lambda: q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE state = 'succeeded'")[0][0] == 160,
                   90, message=lambda: str(q(conn, schema, "SELECT state::text, count(*) FROM {s}.jobs GROUP BY 1")))
    _check_children_ran_after_their_parents(conn, schema, graphs)
    runs = q(conn, schema, "SELECT count(*) FROM {s}.ledger WHERE event = 'run'")[0][0]
    assert runs == 40  # nothing was killed: exactly one run per child


def test_kill_9_of_the_claimers_completing_parents_loses_no_child_and_doubles_none(env, pg_dsn, conn):
    """Claimers killed with SIGKILL while they run and complete parents (the settler or the
    reaper then finishes them): every child is unblocked once, by whichever statement
    completed its last parent, and runs after it."""
    schema = env.settings.schema
    graphs = []
    for g in range(15):
        ids = env.enqueue_many([JobSpec("sturdy", {"seconds": 0.1 + 0.02 * k}, ref=f"p{k}") for k in range(4)] +
                               [JobSpec("sink", None, depends_on=[f"p{k}" for k in range(4)])])
        graphs.append((ids[:4], ids[4]))
    rng = random.Random(21)
    with Worker(pg_dsn, schema, "--concurrency", "3", "--batch-size", "2", "--lease", "3") as w:
        deadline = time.monotonic() + 6
        kills = 0
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.1, 0.4))
            pids = w.claimer_pids()
            if pids:
                try:
                    os.kill(rng.choice(pids), signal.SIGKILL)
                    kills += 1
                except ProcessLookupError:
                    pass
        wait_until(lambda: q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE state = 'succeeded'")[0][0] == 75,
                   120, message=lambda: str(q(conn, schema, "SELECT state::text, count(*) FROM {s}.jobs GROUP BY 1"))
                   + w.logs()[-3000:])
    assert kills >= 5
    _check_children_ran_after_their_parents(conn, schema, graphs)


def test_a_workers_progress_is_on_the_row(env, pg_dsn, conn):
    schema = env.settings.schema
    job_id = env.enqueue("progresses")
    with Worker(pg_dsn, schema, "--concurrency", "1"):
        assert env.wait_result(job_id, timeout=60) == 0.5
    job = env.get_job(job_id)
    assert (job["progress"], job["progress_message"]) == (0.5, "half way") and job["progress_at"] is not None


def test_unblock_latency_is_a_histogram_of_the_dependents_first_claims(env, pg_dsn, conn):
    """A fan-out of 10 children behind one parent, 5 jobs without parents and one child
    enqueued after its parent had succeeded (never blocked): scraped from a real worker's
    /metrics, pgworker_job_unblock_wait_duration_seconds counts exactly the 10 dependents
    that waited, each observed once, and the trigger stamped their unblocked_at with the
    parent's completion."""
    from obs import free_port, total, wait_for_metrics, wait_ready

    schema = env.settings.schema
    port = free_port()
    parent = env.enqueue("sturdy", {"seconds": 0.3})
    children = env.enqueue_many([JobSpec("returns", {"c": i}, depends_on=[parent]) for i in range(10)])
    loose = env.enqueue_many([("returns", {"loose": i}) for i in range(5)])
    with Worker(pg_dsn, schema, "--concurrency", "2", "--metrics-port", str(port), "--metrics-host", "127.0.0.1"):
        wait_ready(port)
        for job_id in children + loose:
            env.wait_result(job_id, timeout=60)
        late = env.enqueue("returns", {"late": True}, depends_on=[parent])
        env.wait_result(late, timeout=60)
        text = wait_for_metrics(port, lambda t: total(t, "pgworker_job_wait_duration_seconds_count") >= 17, 60,
                                "every claim observed")
    assert total(text, "pgworker_job_wait_duration_seconds_count") == 17
    assert total(text, "pgworker_job_unblock_wait_duration_seconds_count") == 10
    assert 0 <= total(text, "pgworker_job_unblock_wait_duration_seconds_sum") < 10 * 30
    assert total(text, "pgworker_job_unblock_wait_duration_seconds_bucket", le="+Inf") == 10
    [(finished,)] = q(conn, schema, "SELECT finished_at FROM {s}.jobs WHERE id = %s", parent)
    stamped = q(conn, schema, "SELECT id, unblocked_at FROM {s}.jobs WHERE id = ANY(%s)",
                children + loose + [late])
    assert {i for i, at in stamped if at is not None} == set(children)
    assert {at for i, at in stamped if at is not None} == {finished}  # the completing statement's now()
    assert env.get_job(children[0])["unblocked_at"] == finished  # `pgworker jobs show` prints it
    assert env.get_job(late)["unblocked_at"] is None


def test_replaying_a_dead_parent_brings_back_the_plain_children_its_death_cancelled(env, pg_dsn, conn):
    """docs/graphs.md's first shape, linked by depends_on alone (no graph id, so `graphs
    replay` cannot reach it): a parent that dies cancels its cancel-policy child and what
    waits below; `pgworker dead replay` of the parent brings them back, and they run."""
    import subprocess
    import sys

    schema = env.settings.schema
    p = env.enqueue("dies_first")
    c = env.enqueue("record", 1, depends_on=[p], on_parent_failure="cancel")
    gc = env.enqueue("record", 2, depends_on=[c])
    with Worker(pg_dsn, schema, "--concurrency", "2", "--poll-interval", "0.3"):
        wait_until(lambda: env.get_job(gc)["state"] == "cancelled", 60, message="the parent died")
        assert [env.get_job(i)["last_error_code"] for i in (c, gc)] == ["PARENT_DEAD"] * 2
        cli_env = dict(os.environ, PGWORKER_DSN=pg_dsn, PGWORKER_SCHEMA=schema)
        out = subprocess.run([sys.executable, "-m", "pgworker.cli", "dead", "replay", str(p)], env=cli_env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "replayed 1 job" in out.stdout and "2 children cancelled by their death wait again" in out.stdout
        wait_until(lambda: {env.get_job(i)["state"] for i in (p, c, gc)} == {"succeeded"}, 60,
                   message="the parent, its child and grandchild succeeded after the replay")
    kinds = q(conn, schema, "SELECT job_id, kind FROM {s}.job_events WHERE job_id = ANY(%s) ORDER BY id",
              [p, c, gc])
    assert kinds == [(p, "replayed"), (c, "replayed"), (gc, "replayed")]
