"""Randomized claim order against a SQL oracle (issue 23: the guarantees a faster claim must keep).

Seeded sequences of enqueues (three priorities, run_at in the past at distinct moments or an
hour ahead, ordering keys or none, some jobs with one attempt), claims of 1 to 7 jobs,
completions, failures (retried an hour later, or dead when the attempt was the last) and
releases, on one queue and one claimer, so that the claim's choice is deterministic. Before
each claim, the oracle computes from the table what the claim must take, independently of
the claim's indexes and of the `blocked` flag the store maintains:

- claimable: pending, due (run_at <= now()), no earlier job of its ordering key
  unfinished (pending, running, or dead while it blocks the key), and (issue 21) no parent
  in job_dependencies that has not succeeded (the dependency variant below enqueues jobs
  with depends_on; the oracle reads the edges, never waiting_parents or `blocked`);
- with an aging bound: the claimable jobs due for longer than the bound, oldest first, then
  the rest in (priority DESC, run_at, id) order; without one, only the latter;

and the claim must return exactly those jobs, in that order. Phase 2 replaces the claim
(per-claimer hints, claim_at: design/perf23.md §4); this test is the one it must keep passing.
Nothing here measures time.
"""

from __future__ import annotations

import random
from datetime import timedelta

import psycopg
import pytest
from psycopg import sql

from pgworker import App, RetryPolicy

pytestmark = pytest.mark.integration

QUEUE = "oracle"
LATER = RetryPolicy(base_seconds=3600.0, factor=1.0, max_seconds=3600.0, jitter=0.0)  # retried an hour ahead
AGING = 1800.0

ORACLE = """
WITH claimable AS (
    SELECT j.id, j.priority, j.run_at,
           %(aging)s::float8 IS NOT NULL AND j.run_at <= now() - make_interval(secs => %(aging)s::float8) AS aged
    FROM {jobs} AS j
    WHERE j.queue = %(queue)s AND j.state = 'pending' AND j.run_at <= now()
      AND NOT EXISTS (SELECT 1 FROM {jobs} AS e
                      WHERE j.ordering_key IS NOT NULL AND e.ordering_key = j.ordering_key AND e.id < j.id
                        AND (e.state IN ('pending', 'running') OR (e.state = 'dead' AND e.dead_blocks_key)))
      AND NOT EXISTS (SELECT 1 FROM {edges} AS d JOIN {jobs} AS p ON p.id = d.parent_id
                      WHERE d.child_id = j.id AND p.state <> 'succeeded')
), aged AS (
    SELECT id, run_at FROM claimable WHERE aged ORDER BY run_at, id LIMIT %(limit)s
), rest AS (
    SELECT id, priority, run_at FROM claimable WHERE id NOT IN (SELECT id FROM aged)
    ORDER BY priority DESC, run_at, id
    LIMIT greatest(0, %(limit)s - (SELECT count(*) FROM aged))
)
SELECT id FROM (SELECT id, 0 AS arm, run_at, 0 AS priority FROM aged
                UNION ALL SELECT id, 1, run_at, priority FROM rest) AS x
ORDER BY arm, CASE WHEN arm = 0 THEN run_at END, priority DESC, run_at, id
"""


def _run(app: App, conn: psycopg.Connection, seed: int, *, aging: float | None, steps: int = 240,
         dependencies: bool = False) -> int:
    rng = random.Random(seed)
    jobs = sql.Identifier(app.settings.schema, "jobs")
    oracle = sql.SQL(ORACLE).format(jobs=jobs, edges=sql.Identifier(app.settings.schema, "job_dependencies"))
    now = conn.execute("SELECT now()").fetchone()[0]
    held: list = []
    claims = 0
    for step in range(steps):
        r = rng.random()
        if r >= 0.8 and not held:
            r = 0.6  # nothing held to settle: claim instead
        if r < 0.55:  # a backlog builds up, so that a claim chooses among more jobs than it takes
            past = rng.random() < 0.85
            # distinct moments in the past (an hour or two ago: some beyond the aging bound), or an hour ahead
            run_at = (now - timedelta(seconds=rng.uniform(1, 7200), microseconds=step) if past
                      else now + timedelta(hours=1))
            key = rng.choice((None, None, "a", "b", "c"))
            parents = []
            if dependencies and key is None and rng.random() < 0.5:
                # 1-3 parents among the jobs that can still succeed (a cancelled parent is refused)
                alive = [row[0] for row in conn.execute(sql.SQL(
                    "SELECT id FROM {} WHERE state IN ('pending', 'running', 'succeeded')").format(jobs))]
                parents = rng.sample(alive, min(len(alive), rng.randint(1, 3)))
            app.enqueue("t", {"step": step}, queue=QUEUE, priority=rng.choice((0, 5, 10)), run_at=run_at,
                        ordering_key=key, max_attempts=rng.choice((1, 5)), depends_on=parents or None,
                        on_parent_failure=rng.choice(("hold", "cancel")) if parents else None)
        elif r < 0.8:
            limit = rng.randint(1, 7)
            want = [row[0] for row in conn.execute(oracle, {"queue": QUEUE, "limit": limit, "aging": aging})]
            got = app.claim(QUEUE, limit=limit, lease_seconds=600)
            assert [j.id for j in got] == want, (f"seed {seed}, step {step}: the claim of {limit} took "
                                                 f"{[j.id for j in got]}, the oracle says {want}")
            held.extend(got)
            claims += 1
        else:
            job = held.pop(rng.randrange(len(held)))
            action = rng.random()
            if action < 0.5:
                app.complete(job)
            elif action < 0.8:
                app.fail(job, RuntimeError("again"), retry=LATER)
            else:
                app.release(job)
    return claims


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_strict_priority_claims_match_the_oracle(app: App, conn: psycopg.Connection, seed: int):
    assert _run(app, conn, seed, aging=None) > 20


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_claims_with_priority_aging_match_the_oracle(app: App, conn: psycopg.Connection, seed: int):
    app.configure_queue(QUEUE, aging=AGING)
    assert _run(app, conn, seed, aging=AGING) > 20


@pytest.mark.parametrize("seed", [8, 9, 10])
def test_claims_with_dependencies_match_the_oracle(app: App, conn: psycopg.Connection, seed: int):
    """Issue 21: a job whose parents have not all succeeded is never claimed, and one whose
    last parent succeeded is claimed in its place in the order."""
    if seed == 10:
        app.configure_queue(QUEUE, aging=AGING)
    assert _run(app, conn, seed, aging=AGING if seed == 10 else None, dependencies=True) > 20
    edges = sql.Identifier(app.settings.schema, "job_dependencies")
    assert conn.execute(sql.SQL("SELECT count(*) FROM {}").format(edges)).fetchone()[0] > 20
