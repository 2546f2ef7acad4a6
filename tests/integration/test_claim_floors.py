"""Claims that start from the claimer's floors (issue 23; pgworker.claim_floors, migration 0013).

- with a horizon taken after every write (a claim of nothing), a claim from the floors takes
  exactly what the SQL oracle of test_claim_order_oracle says, through seeded sequences of
  every transition that makes a job claimable: enqueues due now, later or in the past,
  retries, releases, snoozes, ordering keys' promotions, dependents unblocked, replays,
  "retry now", cancels; and the floors are really used (most claims start from one);
- a job enqueued in a transaction that was open across claims is found once it commits,
  although the claims' floors moved on meanwhile: no horizon is granted while a writer holds
  its queue's lock;
- under a REPEATABLE READ snapshot held through a drain, a claim from the floors touches as
  many buffers choosing its jobs after 3,000 jobs as after 300, while the claim from the
  start touches more and more (counts of buffers, never time);
- the horizon, the stamp and the epoch themselves.
Nothing here measures time.
"""

from __future__ import annotations

import random
from datetime import timedelta

import psycopg
import pytest
from psycopg import sql

from pgworker import App, RetryPolicy, operations
from pgworker.claim_floors import ClaimFloors
from pgworker.store.lifecycle import NO_FLOORS

from test_claim_order_oracle import ORACLE

pytestmark = pytest.mark.integration

QUEUE = "floors"
LATER = RetryPolicy(base_seconds=3600.0, factor=1.0, max_seconds=3600.0, jitter=0.0)
SOON = RetryPolicy(base_seconds=0.0, factor=1.0, max_seconds=0.0, jitter=0.0)  # due again at once


class FloorClaimer:
    """Claims as a claimer does (ClaimFloors.claim), on a connection of its own."""

    def __init__(self, app: App, pg_dsn: str) -> None:
        self.app = app
        self.conn = psycopg.connect(pg_dsn, autocommit=True)
        self.floors = ClaimFloors(reset_seconds=3600.0)
        self.from_floors = 0

    def claim(self, limit: int) -> list:
        self.floors.params(QUEUE)
        used = self.floors.used()
        result = self.floors.claim(self.app.store, self.conn, QUEUE, limit=limit, owner="floors",
                                   lease_seconds=600.0, aging_seconds=None)
        self.from_floors += used
        return result.jobs

    def horizon(self) -> None:
        """A claim of nothing: the horizon after the writes so far."""
        self.claim(0)

    def close(self) -> None:
        self.conn.close()


def _oracle(conn: psycopg.Connection, app: App, limit: int, aging: float | None) -> list[int]:
    q = sql.SQL(ORACLE).format(jobs=sql.Identifier(app.settings.schema, "jobs"),
                               edges=sql.Identifier(app.settings.schema, "job_dependencies"))
    return [r[0] for r in conn.execute(q, {"queue": QUEUE, "limit": limit, "aging": aging})]


# Each mix a probability per kind of write: an enqueue with a run_at in the past, a job with
# an ordering key, one with parents, and how a held job ends (release, snooze, retry soon).
# "all" has every kind; the others leave out what would bump the epoch anyway, so that
# each bump the statement under test owes is the only one (each fails without it).
MIXES = {
    "all": {"past": 0.1, "key": 0.4, "parents": 0.15, "release": 0.15, "snooze": 0.15, "soon": 0.1},
    "keys": {"past": 0.0, "key": 0.9, "parents": 0.0, "release": 0.0, "snooze": 0.0, "soon": 0.0},
    "graphs": {"past": 0.0, "key": 0.0, "parents": 0.6, "release": 0.0, "snooze": 0.0, "soon": 0.0},
}


def _run(app: App, conn: psycopg.Connection, pg_dsn: str, seed: int, *, aging: float | None = None,
         steps: int = 300, mix: str = "all") -> FloorClaimer:
    rng = random.Random(seed)
    m = MIXES[mix]
    claimer = FloorClaimer(app, pg_dsn)
    jobs = sql.Identifier(app.settings.schema, "jobs")
    now = conn.execute("SELECT now()").fetchone()[0]
    held: list = []
    try:
        for step in range(steps):
            r = rng.random()
            if r >= 0.75 and not held:
                r = 0.5
            if r < 0.45:
                kind = rng.random()
                run_at = delay = None
                if kind < m["past"]:  # in the past: behind every floor (the epoch is bumped)
                    run_at = now - timedelta(seconds=rng.uniform(1, 7200), microseconds=step)
                elif kind < m["past"] + 0.1:
                    delay = 3600.0
                key = rng.choice(("a", "b", "c")) if rng.random() < m["key"] else None
                parents = []
                if key is None and rng.random() < m["parents"]:
                    alive = [row[0] for row in conn.execute(sql.SQL(
                        "SELECT id FROM {} WHERE state IN ('pending', 'running', 'succeeded')").format(jobs))]
                    parents = rng.sample(alive, min(len(alive), rng.randint(1, 2)))
                app.enqueue("t", {"step": step}, queue=QUEUE, priority=rng.choice((0, 0, 5, 10)), run_at=run_at,
                            delay=delay, ordering_key=key, max_attempts=rng.choice((1, 5)),
                            depends_on=parents or None)
            elif r < 0.5:
                op = rng.random()
                if op < 0.5:  # replay a dead job (it comes back due now)
                    dead = conn.execute(sql.SQL("SELECT id FROM {} WHERE state = 'dead' AND queue = %s LIMIT 1")
                                        .format(jobs), [QUEUE]).fetchone()
                    if dead:
                        app.replay([dead[0]])
                elif op < 0.8:  # "retry now" of a job scheduled later
                    later = conn.execute(sql.SQL("SELECT id FROM {} WHERE state = 'pending' AND run_at > now() "
                                                 "AND queue = %s LIMIT 1").format(jobs), [QUEUE]).fetchone()
                    if later:
                        operations.retry(app.core, later[0], actor="test")
                else:  # cancel a pending job (its key's next job is promoted)
                    pending = conn.execute(sql.SQL("SELECT id FROM {} WHERE state = 'pending' AND queue = %s "
                                                   "ORDER BY random() LIMIT 1").format(jobs), [QUEUE]).fetchone()
                    if pending:
                        app.cancel(pending[0])
            elif r < 0.75:
                claimer.horizon()
                limit = rng.randint(1, 6)
                want = _oracle(conn, app, limit, aging)
                got = claimer.claim(limit)
                assert [j.id for j in got] == want, (f"seed {seed}, step {step}: the claim of {limit} from floors "
                                                     f"{claimer.floors.params(QUEUE)} took {[j.id for j in got]}, "
                                                     f"the oracle says {want}")
                held.extend(got)
            else:
                job = held.pop(rng.randrange(len(held)))
                action = rng.random()
                if action < 1 - m["release"] - m["snooze"] - m["soon"] - 0.1:
                    app.complete(job)
                elif action < 1 - m["release"] - m["snooze"] - m["soon"]:
                    app.fail(job, RuntimeError("again"), retry=LATER)
                elif action < 1 - m["release"] - m["snooze"]:
                    app.fail(job, RuntimeError("again"), retry=SOON)
                elif action < 1 - m["snooze"]:
                    app.release(job)
                else:
                    with app.connection() as c:
                        app.store.snooze(c, [job.lease], [rng.choice((0.0, 3600.0))], [job.ordering_key])
        return claimer
    finally:
        claimer.close()


@pytest.mark.parametrize("seed", [11, 12, 13, 14, 15])
def test_claims_from_floors_match_the_oracle(app: App, conn: psycopg.Connection, pg_dsn: str, seed: int):
    claimer = _run(app, conn, pg_dsn, seed)
    assert claimer.from_floors > 20  # the floors were used, not dropped every time


@pytest.mark.parametrize("mix", ["keys", "graphs"])
@pytest.mark.parametrize("seed", [21, 22])
def test_claims_from_floors_match_the_oracle_with_one_kind_of_backdated_job(app: App, conn: psycopg.Connection,
                                                                              pg_dsn: str, seed: int, mix: str):
    """Ordering keys' next jobs only (promoted with the run_at of their enqueue), or
    dependents only (unblocked likewise): without their statement's epoch bump, a claim
    from the floors passes them."""
    claimer = _run(app, conn, pg_dsn, seed, mix=mix)
    assert claimer.from_floors > 20


@pytest.mark.parametrize("seed", [16, 17])
def test_claims_from_floors_with_priority_aging_match_the_oracle(app: App, conn: psycopg.Connection,
                                                                 pg_dsn: str, seed: int):
    app.configure_queue(QUEUE, aging=1800.0)
    claimer = _run(app, conn, pg_dsn, seed, aging=1800.0)
    assert claimer.from_floors > 20


def test_a_job_enqueued_by_a_transaction_open_across_claims_is_found(app: App, pg_dsn: str):
    claimer = FloorClaimer(app, pg_dsn)
    try:
        app.enqueue_many([{"task": "t", "payload": {"i": i}, "queue": QUEUE} for i in range(3)])
        claimer.horizon()
        with psycopg.connect(pg_dsn) as producer:  # a transaction: its job is stamped now, committed later
            begun = producer.execute("SELECT now()").fetchone()[0]
            app.enqueue("t", {"late": True}, queue=QUEUE, conn=producer)
            late = producer.execute(sql.SQL("SELECT max(id) FROM {}").format(
                sql.Identifier(app.settings.schema, "jobs"))).fetchone()[0]
            for i in range(4):  # claims move on past jobs enqueued after the open one's stamp
                app.enqueue_many([{"task": "t", "payload": {"i": i}, "queue": QUEUE} for i in range(2)])
                taken = claimer.claim(10)
                assert taken and late not in [j.id for j in taken]
                # its lock is held: the horizon is not granted, its time the producer's start
                at, granted = claimer.conn.execute(sql.SQL("SELECT at, granted FROM {}.claim_horizon(%s)").format(
                    sql.Identifier(app.settings.schema)), [QUEUE]).fetchone()
                assert not granted and at == begun
        assert claimer.floors.used()
        assert [j.id for j in claimer.claim(10)] == [late]
    finally:
        claimer.close()


def test_floors_follow_writers_in_flight_to_the_oldest_ones_start(app: App, pg_dsn: str):
    """Producers always in flight keep the horizon from being granted; its time is then
    the oldest writer's transaction start, and the floors move on to it (not beyond):
    a stream of short producer transactions does not freeze them. The writer's own job,
    stamped after its start, is found once it commits."""
    claimer = FloorClaimer(app, pg_dsn)
    try:
        _plain(app, 3)
        claimer.horizon()
        baseline = claimer.floors._queues[QUEUE].horizon_at
        _plain(app, 5)  # committed after the baseline horizon
        with psycopg.connect(pg_dsn) as producer:
            begun = producer.execute("SELECT now()").fetchone()[0]
            app.enqueue("t", {"in flight": True}, queue=QUEUE, conn=producer)
            late = producer.execute(sql.SQL("SELECT max(id) FROM {}").format(
                sql.Identifier(app.settings.schema, "jobs"))).fetchone()[0]
            _plain(app, 5)  # committed while the producer is in flight
            assert len(claimer.claim(8)) == 8  # the horizon: not granted, the producer's start
            qf = claimer.floors._queues[QUEUE]
            assert qf.horizon_at == begun > baseline
            assert len(claimer.claim(10)) == 5
            assert claimer.floors.params(QUEUE)["floor_default"] == begun  # moved on, to its start only
        assert [j.id for j in claimer.claim(10)] == [late]
    finally:
        claimer.close()


def test_a_job_enqueued_late_in_a_long_transaction_is_found(app: App, pg_dsn: str):
    """The stamp is the clock read after the lock, not the transaction's start: a
    transaction that began before the claims' horizons and enqueues at its end must not
    stamp its job below the floors those horizons allowed."""
    claimer = FloorClaimer(app, pg_dsn)
    try:
        with psycopg.connect(pg_dsn) as producer:
            producer.execute("SELECT 1")  # the transaction has begun: now() is fixed here
            for i in range(4):  # claims (and horizons) after that start move the floors on
                app.enqueue_many([{"task": "t", "payload": {"i": i}, "queue": QUEUE} for i in range(2)])
                assert claimer.claim(10)
            app.enqueue("t", {"late": True}, queue=QUEUE, conn=producer)
            late = producer.execute(sql.SQL("SELECT max(id) FROM {}").format(
                sql.Identifier(app.settings.schema, "jobs"))).fetchone()[0]
        assert claimer.floors.used()
        claimer.horizon()
        assert [j.id for j in claimer.claim(10)] == [late]
    finally:
        claimer.close()


def _plain(app: App, n: int) -> None:
    app.enqueue_many([{"task": "t", "payload": {"i": i}, "queue": QUEUE} for i in range(n)])


def test_a_parent_locked_by_a_dependents_enqueue_across_claims_is_found(app: App, pg_dsn: str):
    """An enqueue with depends_on locks its parents until it commits (job_parents_lock):
    a claim skips a locked parent that is claimable, and its floor passes it. The lock's
    epoch bump makes the next claim walk from the start."""
    parent = app.enqueue("t", {"parent": True}, queue=QUEUE)
    _plain(app, 4)
    claimer = FloorClaimer(app, pg_dsn)
    try:
        claimer.horizon()
        with psycopg.connect(pg_dsn) as producer:
            app.enqueue("t", {"child": True}, queue=QUEUE, depends_on=[parent], conn=producer)
            taken = [j.id for j in claimer.claim(10)]
            assert parent not in taken and len(taken) == 4  # skipped while locked
            _plain(app, 1)
            claimer.claim(10)  # the floors move on past the parent
        claimer.horizon()
        assert parent in [j.id for j in claimer.claim(10)]
    finally:
        claimer.close()


def test_a_periodic_job_for_a_past_slot_is_found(app: App, conn: psycopg.Connection, pg_dsn: str):
    """A schedule's job has its slot for run_at, behind the floors once claims moved on:
    schedule_fire bumps the epoch."""
    _plain(app, 3)
    claimer = FloorClaimer(app, pg_dsn)
    try:
        claimer.horizon()
        assert len(claimer.claim(10)) == 3
        _plain(app, 2)
        assert len(claimer.claim(10)) == 2
        assert claimer.floors.used()
        now = conn.execute("SELECT now()").fetchone()[0]
        slot = now - timedelta(hours=1)
        app.store.register_schedule(conn, name="hourly", task="t", queue=QUEUE, cron="0 * * * *", timezone="UTC",
                                    missed="latest", initial_slot=slot - timedelta(hours=1), next_slot=slot)
        advanced, job_id = app.store.fire_schedule(conn, name="hourly", slot=slot, next_slot=now, skipped=0,
                                                   enqueue=True, task="t", queue=QUEUE, payload_json="{}",
                                                   priority=0, max_attempts=5)
        assert advanced and job_id
        claimer.horizon()
        assert [j.id for j in claimer.claim(10)] == [job_id]
    finally:
        claimer.close()


def _subplan_buffers(node: dict, names: tuple[str, ...]) -> int:
    if node.get("Subplan Name") in names:
        return int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))
    return sum(_subplan_buffers(child, names) for child in node.get("Plans", []))


def _buffers(conn: psycopg.Connection, app: App, floors: dict | None) -> int:
    """Shared buffers the scans of one claim of 50 touch choosing its jobs (EXPLAIN ANALYZE
    BUFFERS, rolled back): the priority walk and each priority's range (the rest of the
    statement, the update by primary key, grows with the primary key's height alone)."""
    params = {"queue": QUEUE, "limit": 50, "owner": "probe", "lease_seconds": 60.0, "aging_seconds": None,
              "locked": False, **NO_FLOORS, **(floors or {})}
    with conn.transaction(force_rollback=True):
        [[plan]] = conn.execute("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) "
                                + app.store.queries["job_claim"], params).fetchall()
    return _subplan_buffers(plan[0]["Plan"], ("CTE priorities", "CTE ranked_top"))


def test_claims_from_floors_stay_flat_under_a_held_snapshot(app: App, conn: psycopg.Connection, pg_dsn: str):
    app.enqueue_many([{"task": "t", "payload": {"i": i}, "queue": QUEUE} for i in range(4000)])
    claimer = FloorClaimer(app, pg_dsn)
    probe = psycopg.connect(pg_dsn)
    holder = psycopg.connect(pg_dsn)
    try:
        _buffers(probe, app, None)  # the session's first claim reads the catalog (claim_horizon's first call)
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(app.settings.schema, "jobs")))
        seen: dict[int, tuple[int, int]] = {}
        done = 0
        while done < 3000:
            jobs = claimer.claim(50)
            assert jobs
            app.store.complete(claimer.conn, [j.lease for j in jobs], [j.ordering_key for j in jobs])
            done += len(jobs)
            if done in (300, 3000):
                claimer.floors.params(QUEUE)
                floors = claimer.floors.params(QUEUE)
                assert floors["floor_priorities"] == [0]
                seen[done] = (_buffers(probe, app, floors), _buffers(probe, app, None))
        (floor_300, start_300), (floor_3000, start_3000) = seen[300], seen[3000]
        # from the start, the claim re-reads the 2,700 jobs claimed since (a heap page and more
        # for every few dozen); from the floor, one descent: the same as at 300, give or take
        # a page
        assert start_3000 > start_300 + 100, seen
        assert floor_3000 <= floor_300 + 5, seen
    finally:
        holder.close()
        probe.close()
        claimer.close()


def test_the_horizon_stamp_and_epoch(app: App, pg_dsn: str):
    s = sql.Identifier(app.settings.schema)
    horizon = sql.SQL("SELECT at, epoch, granted FROM {}.claim_horizon(%s)").format(s)
    with psycopg.connect(pg_dsn, autocommit=True) as a, psycopg.connect(pg_dsn) as b:
        at, epoch, granted = a.execute(horizon, ["x"]).fetchone()
        assert at is not None and epoch == 0 and granted
        begun = b.execute("SELECT now()").fetchone()[0]
        stamp = b.execute(sql.SQL("SELECT {}.claim_stamp(ARRAY['x'])").format(s)).fetchone()[0]
        assert stamp > at and stamp > begun
        # b holds x's bucket lock until it ends: the horizon for x (and any queue of its
        # bucket) is not granted, its time b's start (every job b stamps is stamped after)
        assert a.execute(horizon, ["x"]).fetchone() == (begun, 0, False)
        other = next(q for q in (f"q{i}" for i in range(100))
                     if a.execute("SELECT hashtext(%s) & 15 <> hashtext('x') & 15", [q]).fetchone()[0])
        assert a.execute(horizon, [other]).fetchone()[2] is True
        assert b.execute(sql.SQL("SELECT {}.claim_backdate(ARRAY['x', 'x'])").format(s)).fetchone()[0] == 2
        # the bump is seen at once (a sequence); granted only once b has ended
        assert a.execute(horizon, ["x"]).fetchone()[1:] == (2, False)
        b.commit()
        at2, epoch2, granted2 = a.execute(horizon, ["x"]).fetchone()
        assert at2 is not None and epoch2 == 2 and granted2
        # the session lock of the horizon is never left behind
        assert a.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
                         ).fetchone()[0] == 0


def test_the_drain_exit_probe_counts_rows_another_transaction_locks_and_bumps_the_epoch(app: App, pg_dsn: str):
    """A drain run's exit probe (Store.due_locked_count) locks due rows for a moment: a
    claim running then skips them, so it bumps the epoch as a claim that locked jobs
    without taking them does, and it leaves no lock behind."""
    s = sql.Identifier(app.settings.schema)
    horizon = sql.SQL("SELECT epoch FROM {}.claim_horizon(%s)").format(s)
    first, held, _third = [app.enqueue("t", {"i": i}, queue=QUEUE) for i in range(3)]
    with psycopg.connect(pg_dsn, autocommit=True) as a, psycopg.connect(pg_dsn) as operator:
        operator.execute(sql.SQL("SELECT 1 FROM {}.jobs WHERE id = %s FOR UPDATE").format(s), [held])
        epoch = a.execute(horizon, [QUEUE]).fetchone()[0]
        assert app.store.due_locked_count(a, [QUEUE]) == 1
        assert a.execute(horizon, [QUEUE]).fetchone()[0] == epoch + 1
        assert app.store.due_locked_count(a, [QUEUE], limit=1) == 0  # only the first due job, by id, probed
        assert a.execute("SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype <> 'virtualxid' "
                         "AND relation IS DISTINCT FROM 'pg_locks'::regclass").fetchone()[0] == 0
        assert a.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        operator.rollback()
        assert app.store.due_locked_count(a, [QUEUE]) == 0
    taken = {j.id for j in app.claim(QUEUE, limit=10)}
    assert {first, held} <= taken and len(taken) == 3
