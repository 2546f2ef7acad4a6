"""Every keyed transition goes through the one path (pgworker/store/keyed.py): it takes
its ordering key's lock before it writes, and the next job of the key is promoted after
it. One case per transition that can end (or bring back) a key's head: if a store method
ran its statement around the path, it would either not wait for a key another
transaction holds, or leave the next job of the key blocked for good."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import psycopg
import pytest

from pgworker.errors import DatabaseBusy
from pgworker.jobs import FailRequest
from worker import q

pytestmark = pytest.mark.integration

KEY = "k"


class Case(NamedTuple):
    action: Callable[[psycopg.Connection], Any]  # the transition, on the connection given
    next_id: int | Callable[[], int]  # the job of KEY that must be claimable after it (or how to find it)
    waits: bool = True  # waits for the key's lock (False: maintenance, which skips the key)


def _pair(app, conn, *, claim: bool = True, **kw):
    a = app.enqueue("t", "a", ordering_key=KEY, **kw)
    b = app.enqueue("t", "b", ordering_key=KEY, **kw)
    job = app.claim()[0] if claim else None
    return a, b, job


def _dead(app, conn, **kw):
    a, b, job = _pair(app, conn, **kw)
    app.store.fail(conn, [FailRequest(job.lease, "E", "bad", 0, permanent=True)])
    return a, b


def _expired(app, conn):
    q(conn, app.settings.schema,
      "UPDATE {s}.jobs SET lease_expires_at = now() - interval '1s' WHERE state = 'running' RETURNING id")


def complete(app, conn):
    a, b, job = _pair(app, conn)
    return Case(lambda c: app.store.complete(c, [job.lease]), b)  # the key read from the row


def fail_to_dead_with_skip(app, conn):
    a, b, job = _pair(app, conn, ordering_on_dead="skip")
    return Case(lambda c: app.store.fail(c, [FailRequest(job.lease, "E", "bad", 0, permanent=True)]), b)


def _cancel_requested(app, conn):
    a, b, job = _pair(app, conn)
    assert app.cancel(a) == "running"
    return b, job


def fail_with_cancel_requested(app, conn):
    b, job = _cancel_requested(app, conn)
    return Case(lambda c: app.store.fail(c, [FailRequest(job.lease, "E", "retry", 0)]), b)


def release_with_cancel_requested(app, conn):
    b, job = _cancel_requested(app, conn)
    return Case(lambda c: app.store.release(c, [job.lease]), b)


def snooze_with_cancel_requested(app, conn):
    b, job = _cancel_requested(app, conn)
    return Case(lambda c: app.store.snooze(c, [job.lease], [0]), b)


def finish_cancelled(app, conn):
    b, job = _cancel_requested(app, conn)
    return Case(lambda c: app.store.finish_cancelled(c, [job.lease]), b)


def cancel_pending_head(app, conn):
    a, b, _ = _pair(app, conn, claim=False)
    return Case(lambda c: app.store.cancel(c, a, actor="test"), b)


def cancel_dead_head(app, conn):
    a, b = _dead(app, conn)
    return Case(lambda c: app.store.cancel(c, a, actor="test"), b)


def replay_dead_head(app, conn):
    a, b = _dead(app, conn)
    return Case(lambda c: app.store.replay(c, ids=[a], actor="test"), a)  # the replayed head runs first


def reap_to_dead_with_skip(app, conn):
    a, b, _ = _pair(app, conn, ordering_on_dead="skip", max_attempts=1)
    _expired(app, conn)
    return Case(lambda c: app.store.reap(c, limit=10), b, waits=False)


def reap_with_cancel_requested(app, conn):
    b, _ = _cancel_requested(app, conn)
    _expired(app, conn)
    return Case(lambda c: app.store.reap(c, limit=10), b, waits=False)


def prune_dead_head(app, conn):
    a, b = _dead(app, conn)
    q(conn, app.settings.schema,
      "UPDATE {s}.jobs SET finished_at = now() - interval '2 days' WHERE id = %s RETURNING id", a)
    return Case(lambda c: app.store.prune(c, succeeded_seconds=None, cancelled_seconds=None, dead_seconds=3600,
                                          limit=10), b, waits=False)


def enqueue_many_with_a_refused_dedupe_key(app, conn):
    app.enqueue("t", "holder", dedupe_key="d")  # holds the dedupe key: the batch's first job of KEY is refused
    assert len(app.claim()) == 1  # running, it still holds the key (and is not claimable)
    ids: list[int] = []

    def action(c):
        ids.extend(app.enqueue_many([{"task": "t", "dedupe_key": "d", "ordering_key": KEY},
                                     {"task": "t", "ordering_key": KEY}], conn=c))

    return Case(action, lambda: ids[-1])  # the batch's second job


CASES = [complete, fail_to_dead_with_skip, fail_with_cancel_requested, release_with_cancel_requested,
         snooze_with_cancel_requested, finish_cancelled, cancel_pending_head, cancel_dead_head,
         replay_dead_head, reap_to_dead_with_skip, reap_with_cancel_requested, prune_dead_head,
         enqueue_many_with_a_refused_dedupe_key]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_the_next_job_of_the_key_is_promoted(app, conn, case):
    made = case(app, conn)
    with app.connection() as c:
        made.action(c)
    assert [j.id for j in app.claim(limit=5)] == [_next(made)]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_the_transition_takes_the_keys_lock_first(app, conn, pg_dsn, case):
    """While another transaction holds the key's lock, the transition waits for it (here:
    fails on a short lock_timeout, having written nothing), or, for maintenance, passes
    the key over; either way the key's next job stays blocked until the lock is free."""
    made = case(app, conn)
    with psycopg.connect(pg_dsn) as holder, psycopg.connect(pg_dsn, autocommit=True) as c:
        holder.execute("SELECT pg_advisory_xact_lock(hashtext(%s), hashtext(%s))",
                       (app.store._ordering_namespace, KEY))
        c.execute("SET lock_timeout = '200ms'")
        if made.waits:
            with pytest.raises((psycopg.errors.LockNotAvailable, DatabaseBusy)):  # DatabaseBusy: the App's wrapper
                made.action(c)
        else:
            made.action(c)
        if not callable(made.next_id):
            assert not _claimable(conn, app, made.next_id)
        holder.rollback()
        c.execute("RESET lock_timeout")
        made.action(c)
    assert [j.id for j in app.claim(limit=5)] == [_next(made)]


def _next(made: Case) -> int:
    return made.next_id() if callable(made.next_id) else made.next_id


def _claimable(conn, app, job_id) -> bool:
    return q(conn, app.settings.schema, "SELECT state = 'pending' AND NOT blocked FROM {s}.jobs WHERE id = %s",
             job_id) == [(True,)]
