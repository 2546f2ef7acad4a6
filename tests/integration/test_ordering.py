"""Per-key ordering: one job of a key at a time in enqueue order, the dead-head policies,
gaps, retries, replay, and the claim never held back by a busy key."""

from __future__ import annotations

import random
import threading
import time

import psycopg
import pytest

import pgworker
from pgworker import JobSpec, Permanent
from worker import q

pytestmark = pytest.mark.integration
NO_BACKOFF = pgworker.RetryPolicy(base_seconds=0, max_seconds=0, jitter=0)


def due_now(conn, schema, *ids):
    q(conn, schema, "UPDATE {s}.jobs SET run_at = now() WHERE id = ANY(%s) RETURNING id", list(ids))


def run_one_at_a_time(app):
    """Claim and complete until nothing is due; each claim must hold one job (the keys
    under test have one active job each). Returns the ids in the order they ran."""
    seen = []
    while jobs := app.claim(limit=10):
        assert len(jobs) == 1
        seen.append(jobs[0].id)
        app.complete(jobs[0])
    return seen


def states(conn, schema, ids):
    rows = dict(q(conn, schema, "SELECT id, state::text || CASE WHEN blocked THEN '/blocked' ELSE '' END "
                                "FROM {s}.jobs WHERE id = ANY(%s)", list(ids)))
    return [rows[i] for i in ids]


def test_batch_claims_take_one_job_per_key_in_enqueue_order(app):
    ids = {k: [app.enqueue("t", {"k": k, "n": n}, ordering_key=k) for n in range(4)] for k in "abc"}
    plain = app.enqueue("t", "unkeyed")
    order: dict[str, list[int]] = {k: [] for k in "abc"}
    while True:
        jobs = app.claim(limit=50)
        if not jobs:
            break
        keys = [j.ordering_key for j in jobs if j.ordering_key]
        assert len(keys) == len(set(keys))  # never two jobs of a key in one batch
        for j in jobs:
            if j.ordering_key:
                order[j.ordering_key].append(j.id)
            app.complete(j)
    assert order == ids
    assert app.get_job(plain)["state"] == "succeeded"


def test_a_busy_key_never_holds_back_other_keys(app, conn):
    schema = app.settings.schema
    busy = app.enqueue_many([JobSpec("t", i, ordering_key="busy") for i in range(200)])
    [head] = app.claim(limit=1)  # the busy key's head is now running
    assert head.id == busy[0]
    retrying = app.enqueue("t", "r", ordering_key="retrying")
    waiting = app.enqueue("t", "w", ordering_key="waiting", delay=3600)
    app.enqueue("t", "w2", ordering_key="waiting")
    [r] = app.claim(limit=1)
    app.fail(r, RuntimeError("transient"))  # the head of 'retrying' waits for its retry
    others = [app.enqueue("t", i, ordering_key=f"k{i}") for i in range(5)]
    # one claim, however small, finds the due work of other keys at once: the 199 blocked
    # jobs of 'busy', the retrying head and the delayed head are not in the claim index
    got = []
    for _ in range(5):
        [job] = app.claim(limit=1)
        got.append(job.id)
    assert sorted(got) == others
    assert app.claim(limit=10) == []
    assert states(conn, schema, [retrying, waiting]) == ["pending", "pending"]


def test_gaps_in_a_key_do_not_stall_it(app, pg_dsn):
    """Rolled-back enqueues (holes in the id sequence), a duplicate refused by its dedupe
    key, and a cancelled job in the middle: the key still runs everything in order."""
    first = app.enqueue("t", 0, ordering_key="g")
    with psycopg.connect(pg_dsn) as tx:
        app.enqueue("t", "rolled back", ordering_key="g", conn=tx)
        tx.rollback()
    second = app.enqueue("t", 1, ordering_key="g", dedupe_key="d1")
    assert app.enqueue("t", "dup", ordering_key="g", dedupe_key="d1") == second
    middle = app.enqueue("t", 2, ordering_key="g")
    last = app.enqueue("t", 3, ordering_key="g")
    assert app.cancel(middle) == "cancelled"
    assert run_one_at_a_time(app) == [first, second, last]


def test_a_retrying_head_keeps_its_place(app, conn):
    schema = app.settings.schema
    a, b = app.enqueue("t", ordering_key="r", max_attempts=3), app.enqueue("t", ordering_key="r")
    [job] = app.claim()
    assert app.fail(job, RuntimeError("try again")) == "pending"
    assert app.claim() == []  # the head waits for its backoff; b stays blocked
    assert states(conn, schema, [a, b]) == ["pending", "pending/blocked"]
    due_now(conn, schema, a)
    [again] = app.claim(limit=5)
    assert again.id == a and again.attempt == 2
    app.complete(again)
    assert [j.id for j in app.claim(limit=5)] == [b]


def test_dead_head_blocks_its_key_until_replayed(app, conn):
    schema = app.settings.schema
    a, b = app.enqueue("t", ordering_key="x"), app.enqueue("t", ordering_key="x")
    [job] = app.claim()
    assert app.fail(job, Permanent("bad")) == "dead"
    c = app.enqueue("t", ordering_key="x")  # enqueued after the death: waits too
    assert app.claim(limit=5) == []
    assert states(conn, schema, [a, b, c]) == ["dead", "pending/blocked", "pending/blocked"]
    [stats] = app.store.queue_stats(conn, ["default"])
    assert stats["dead_blocked_keys"] == 1 and stats["blocked"] == 2
    [listed] = app.store.dead_blocked_keys(conn)
    assert (listed["ordering_key"], listed["dead_job_id"], listed["waiting"]) == ("x", a, 2)
    assert app.replay([a]) == [a]
    assert run_one_at_a_time(app) == [a, b, c]  # the replayed head first, then the rest in order
    assert app.store.queue_stats(conn, ["default"])[0]["dead_blocked_keys"] == 0


def test_dead_head_discarded_lets_the_key_go_on(app, conn):
    a, b = app.enqueue("t", ordering_key="x"), app.enqueue("t", ordering_key="x")
    [job] = app.claim()
    app.fail(job, Permanent("bad"))
    assert app.cancel(a) == "cancelled"  # discard the dead head
    assert [j.id for j in app.claim(limit=5)] == [b]


def test_dead_head_with_skip_policy_lets_the_next_job_run(app, conn):
    schema = app.settings.schema
    a = app.enqueue("t", "a", ordering_key="s", ordering_on_dead="skip")
    b = app.enqueue("t", "b", ordering_key="s", ordering_on_dead="skip")
    c = app.enqueue("t", "c", ordering_key="s", ordering_on_dead="skip")
    [job] = app.claim()
    assert app.fail(job, Permanent("bad")) == "dead"
    assert states(conn, schema, [a, b, c]) == ["dead", "pending", "pending/blocked"]
    assert app.store.queue_stats(conn, ["default"])[0]["dead_blocked_keys"] == 0
    d = app.enqueue("t", "d", ordering_key="s")  # a dead job that does not block is not waited for
    [jb] = app.claim(limit=5)
    assert jb.id == b
    # replaying the dead job while b runs: it waits for b, then goes before c and d
    assert app.replay([a]) == [a]
    assert states(conn, schema, [a]) == ["pending/blocked"]
    assert app.claim(limit=5) == []
    app.complete(jb)
    assert run_one_at_a_time(app) == [a, c, d]


def _dead_heads(app, conn, key, n_behind):
    """A dead head of ``key`` that died two days ago, with ``n_behind`` jobs waiting behind it."""
    schema = app.settings.schema
    head = app.enqueue("t", ordering_key=key, queue=f"q-{key}")
    behind = [app.enqueue("t", ordering_key=key, queue=f"q-{key}") for _ in range(n_behind)]
    [job] = app.claim(f"q-{key}")
    assert app.fail(job, Permanent("bad")) == "dead"
    q(conn, schema, "UPDATE {s}.jobs SET finished_at = now() - interval '2 days' WHERE id = %s RETURNING id", head)
    return head, behind


def test_the_pruner_deleting_a_dead_head_promotes_the_next_job_of_its_key(app, conn):
    """With retention_dead_seconds set, the pruner deleted a dead head and promoted nothing:
    its key's jobs stayed blocked for good, and with the dead row gone `pgworker status` and
    the blocked-keys gauge no longer showed why."""
    from pgworker.worker.pruner import Retention, prune_pass

    schema = app.settings.schema
    head, behind = _dead_heads(app, conn, "x", 2)
    with app.connection() as c:
        assert prune_pass(app.store, c, Retention(None, None, 3600, None))["dead"] == 1
    assert states(conn, schema, behind) == ["pending", "pending/blocked"]
    assert [j.id for j in app.claim("q-x", limit=5)] == behind[:1]
    assert q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE id = %s", head) == [(0,)]


def test_the_pruner_passes_over_a_dead_head_whose_key_is_locked_and_prunes_the_rest(app, conn, pg_dsn):
    """Maintenance never waits for a key: a dead head whose key a caller's open transaction
    holds (it enqueued for the key) stays this pass, and does not hide the dead jobs behind
    it; once the transaction commits, the next pass deletes it and promotes its key."""
    from pgworker.worker.pruner import Retention, prune_pass

    schema = app.settings.schema
    locked_head, locked_behind = _dead_heads(app, conn, "locked", 1)
    free_head, free_behind = _dead_heads(app, conn, "free", 1)
    q(conn, schema, "UPDATE {s}.jobs SET finished_at = now() - interval '3 days' WHERE id = %s RETURNING id",
      locked_head)  # the oldest, first in the pruner's scan
    retention = Retention(None, None, 3600, None)
    with psycopg.connect(pg_dsn) as tx:
        late = app.enqueue("t", ordering_key="locked", queue="q-locked", conn=tx)  # holds the key's lock
        with app.connection() as c:
            assert prune_pass(app.store, c, retention, batch=1)["dead"] == 1  # the free one, behind it
        assert states(conn, schema, [locked_head, *free_behind]) == ["dead", "pending"]
        tx.commit()
    with app.connection() as c:
        assert prune_pass(app.store, c, retention)["dead"] == 1
    assert states(conn, schema, [*locked_behind, late]) == ["pending", "pending/blocked"]
    assert q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE id = ANY(%s)", [locked_head, free_head]) == [(0,)]


def test_reaper_kills_a_head_and_applies_the_policy(app, conn):
    schema = app.settings.schema
    blocking = [app.enqueue("t", ordering_key="rb", max_attempts=1) for _ in range(2)]
    skipping = [app.enqueue("t", ordering_key="rs", max_attempts=1, ordering_on_dead="skip") for _ in range(2)]
    jobs = app.claim(limit=10)
    assert sorted(j.id for j in jobs) == sorted([blocking[0], skipping[0]])
    q(conn, schema, "UPDATE {s}.jobs SET lease_expires_at = now() - interval '1s' WHERE state = 'running' RETURNING id")
    result = app.reap(retry=NO_BACKOFF)
    assert sorted(result.dead) == sorted([blocking[0], skipping[0]])
    assert [j.id for j in app.claim(limit=10)] == [skipping[1]]  # 'rb' stays blocked


def test_cancel_of_a_running_head_promotes_when_it_stops(app, conn):
    a, b = app.enqueue("t", ordering_key="c"), app.enqueue("t", ordering_key="c")
    [job] = app.claim()
    assert app.cancel(a) == "running"
    assert app.claim() == []
    assert app.store.finish_cancelled(conn, [job.lease]).ok  # the key is read from the row
    assert [j.id for j in app.claim()] == [b]


def test_at_most_one_active_job_per_key_is_a_constraint(app, conn):
    schema = app.settings.schema
    app.enqueue("t", ordering_key="u")
    b = app.enqueue("t", ordering_key="u")
    with pytest.raises(psycopg.errors.UniqueViolation):
        q(conn, schema, "UPDATE {s}.jobs SET blocked = false WHERE id = %s RETURNING id", b)


def test_enqueue_many_orders_within_the_batch_and_behind_existing_jobs(app):
    first = app.enqueue("t", "before", ordering_key="m")
    ids = app.enqueue_many([JobSpec("t", i, ordering_key="m" if i % 2 else "n") for i in range(6)])
    m = [first] + [ids[i] for i in range(6) if i % 2]
    n = [ids[i] for i in range(6) if not i % 2]
    seen: dict[str, list[int]] = {"m": [], "n": []}
    while jobs := app.claim(limit=10):
        for j in jobs:
            seen[j.ordering_key].append(j.id)
            app.complete(j)
    assert seen == {"m": m, "n": n}


# Batches mixing dedupe and ordering keys, each with "{p}" standing for a prefix so the
# same batch can be enqueued twice, once job by job and once as one enqueue_many. "held"
# is a dedupe key another job holds beforehand.
MIXED_BATCHES = {
    "held key first": [dict(dedupe_key="held", ordering_key="k"), dict(ordering_key="k")],
    "held key between": [dict(ordering_key="k"), dict(dedupe_key="held", ordering_key="k"), dict(ordering_key="k")],
    "duplicate in the batch": [dict(dedupe_key="d", ordering_key="k"), dict(dedupe_key="d", ordering_key="k"),
                               dict(ordering_key="k")],
    "two keys": [dict(dedupe_key="held", ordering_key="k1"), dict(ordering_key="k2"), dict(ordering_key="k1"),
                 dict(dedupe_key="held", ordering_key="k2"), dict(ordering_key="k1")],
}


def _specs(batch, prefix):
    return [JobSpec("t", n, **{k: f"{prefix}{v}" for k, v in opts.items()}) for n, opts in enumerate(batch)]


def _run_by_key(app):
    """Claim and complete until nothing is due: {ordering key: ids in the order they ran}."""
    seen: dict[str, list[int]] = {}
    while jobs := app.claim(limit=50):
        for j in jobs:
            if j.ordering_key is not None:
                seen.setdefault(j.ordering_key, []).append(j.id)
            app.complete(j)
    return seen


@pytest.mark.parametrize("name", list(MIXED_BATCHES))
def test_enqueue_many_with_dedupe_and_ordering_keys_behaves_as_one_at_a_time(app, conn, name):
    """The first job of a key refused by its dedupe key once left the key's later jobs of
    the batch blocked behind it (they were blocked as "second of the key in the batch") with
    nothing to promote them: stuck for good. The batch must end exactly as the same jobs
    enqueued one at a time, in order."""
    schema = app.settings.schema
    batch = MIXED_BATCHES[name]
    holders = {p: app.enqueue("t", "holder", dedupe_key=f"{p}held") for p in ("one:", "many:")}
    one = [app.enqueue(*spec[:2], dedupe_key=spec.dedupe_key, ordering_key=spec.ordering_key)
           for spec in _specs(batch, "one:")]
    many = app.enqueue_many(_specs(batch, "many:"))
    # the same jobs were refused (the holder's id, or the first duplicate's), and the rest
    # are blocked or not alike
    assert [one.index(i) for i in one] == [many.index(i) for i in many]
    assert [i == holders["one:"] for i in one] == [i == holders["many:"] for i in many]
    assert states(conn, schema, one) == states(conn, schema, many)
    ran = _run_by_key(app)
    position = {i: n for n, i in enumerate(one)} | {i: n for n, i in enumerate(many)}
    assert {k.split(":", 1)[1] for k in ran} == {o["ordering_key"] for o in batch}
    for key in ran:  # each key ran the same jobs of the batch in the same order
        assert [position[i] for i in ran[key]] == [position[i] for i in ran[key.replace("one:", "many:", 1)]]
    assert q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE state = 'pending'") == [(0,)]


def test_enqueue_many_retries_a_job_whose_dedupe_hold_expired_in_its_place(app, conn):
    """A dedupe key held by a succeeded job whose window has passed: the batch's insert is
    refused, the expired hold released, and the job inserted again, with the id reserved
    for it, so it keeps its place in its key (it was re-enqueued with a new id, behind the
    later jobs of its key and blocked like them: the key was stuck)."""
    schema = app.settings.schema
    old = app.enqueue("t", "old", dedupe_key="w", dedupe_window=60)
    [job] = app.claim()
    app.complete(job)
    q(conn, schema, "UPDATE {s}.jobs SET dedupe_until = now() - interval '1 second' WHERE id = %s RETURNING id", old)
    ids = app.enqueue_many([JobSpec("t", 0, dedupe_key="w", ordering_key="k"), JobSpec("t", 1, ordering_key="k")])
    assert old not in ids and ids == sorted(ids)
    assert states(conn, schema, ids) == ["pending", "pending/blocked"]
    assert run_one_at_a_time(app) == ids


def test_concurrent_claimers_and_producers_hammering_few_keys(app, pg_dsn):
    """8 claimer threads with batch claims and random failures (retries of heads, some
    deaths under 'skip'), 2 producers adding jobs meanwhile: per key, attempts never
    overlap, and successes follow enqueue order."""
    schema = app.settings.schema
    keys = ["k0", "k1", "k2"]
    app.enqueue_many([JobSpec("t", i, ordering_key=keys[i % 3], max_attempts=2, ordering_on_dead="skip")
                      for i in range(120)])
    events: list[tuple[float, str, str, int]] = []  # (time, key, start|end, job id)
    lock = threading.Lock()
    active: dict[str, int] = {}
    overlaps: list[str] = []
    stop_producers = threading.Event()

    def producer(p):
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            i = 0
            while not stop_producers.is_set():
                app.store.insert_job(c, queue="default", task="t", payload_json=f'{{"p": {p}, "i": {i}}}',
                                     priority=0, run_at=None, delay_seconds=0, max_attempts=2, dedupe_key=None,
                                     ordering_key=keys[i % 3], trace_context=None, dead_blocks_key=False)
                i += 1
                time.sleep(0.005)

    def claimer(n):
        rng = random.Random(n)
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            idle = 0
            while idle < 20:
                jobs = app.store.claim(c, queue="default", limit=5, owner=f"c{n}", lease_seconds=60)
                if not jobs:
                    idle += 1
                    time.sleep(0.01)
                    continue
                idle = 0
                for j in jobs:
                    with lock:
                        if j.ordering_key in active:
                            overlaps.append(f"{j.id} started while {active[j.ordering_key]} ran")
                        active[j.ordering_key] = j.id
                        events.append((time.monotonic(), j.ordering_key, "start", j.id))
                    fail = rng.random() < 0.15
                    with lock:
                        del active[j.ordering_key]
                        events.append((time.monotonic(), j.ordering_key, "fail" if fail else "end", j.id))
                    # the outcome is written after the bookkeeping: the next job of the key
                    # cannot be claimed before this write commits
                    if fail:
                        app.fail(j, RuntimeError("flaky"), conn=c)
                        due_now(c, schema, j.id)
                    else:
                        app.store.complete(c, [j.lease], [j.ordering_key])

    producers = [threading.Thread(target=producer, args=(p,)) for p in range(2)]
    claimers = [threading.Thread(target=claimer, args=(n,)) for n in range(8)]
    [t.start() for t in producers + claimers]
    time.sleep(1.5)
    stop_producers.set()
    [t.join() for t in producers + claimers]
    assert not overlaps
    with psycopg.connect(pg_dsn) as c:
        left = q(c, schema, "SELECT count(*) FROM {s}.jobs WHERE state IN ('pending', 'running')")[0][0]
        finished = dict(q(c, schema, "SELECT state::text, count(*) FROM {s}.jobs GROUP BY 1"))
    assert left == 0, finished
    for k in keys:
        done = [e[3] for e in events if e[1] == k and e[2] == "end"]
        assert done == sorted(done), f"key {k} succeeded out of enqueue order"
    assert finished.get("dead", 0) > 0 and finished["succeeded"] > 100
