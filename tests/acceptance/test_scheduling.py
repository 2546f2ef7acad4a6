"""Scheduling policies with real `pgworker run` processes (several pods at once): per-key
ordering, global and per-pod concurrency limits, the rate limit, pause, cancellation,
handler control, priority aging and periodic jobs. Invariants are checked from the
database and from a ledger the handlers write (database clock), never from sleeps."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from contextlib import ExitStack

import psycopg
import pytest
import requests

from pg import wait_until
from worker import HERE, Worker, q

pytestmark = pytest.mark.acceptance
SCHEDULE_APP = os.path.join(HERE, "apps", "schedule_app.py") + ":app"
FAST = ["--poll-interval", "0.3", "--reap-interval", "1"]


def finished(conn, schema, n):
    s = dict(q(conn, schema, "SELECT state::text, count(*) FROM {s}.jobs GROUP BY 1"))
    return s.get("succeeded", 0) + s.get("dead", 0) + s.get("cancelled", 0) == n and s


def intervals(conn, schema, where="true", *params):
    """(job id, attempt, start, stop, key) of every attempt in the ledger, from the
    handler's own start and end/fail records."""
    rows = q(conn, schema, "SELECT job_id, attempt, event, at, note FROM {s}.ledger WHERE " + where
             + " ORDER BY at", *params)
    starts = {(r[0], r[1]): (r[3], r[4]) for r in rows if r[2] == "start"}
    stops = {(r[0], r[1]): r[3] for r in rows if r[2] in ("end", "fail")}
    return [(j, a, t0, stops[(j, a)], key) for (j, a), (t0, key) in starts.items() if (j, a) in stops]


def max_overlap(spans):
    """Most attempts running at one instant (a sweep over start/stop events)."""
    events = sorted([(s[2], 1) for s in spans] + [(s[3], -1) for s in spans], key=lambda e: (e[0], e[1]))
    top = cur = 0
    for _, delta in events:
        cur += delta
        top = max(top, cur)
    return top


class RunningSampler:
    """Counts the running jobs of a queue in the jobs table, as fast as it can."""

    def __init__(self, dsn, schema, queue, where=""):
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._sql = "SELECT count(*) FROM {s}.jobs WHERE state = 'running' AND queue = %s" + where
        self._thread = threading.Thread(target=self._run, args=(dsn, schema, queue), daemon=True)

    def _run(self, dsn, schema, queue):
        with psycopg.connect(dsn, autocommit=True) as c:
            while not self._stop.is_set():
                self.samples.append(q(c, schema, self._sql, queue)[0][0])

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def cli(pg_dsn, schema, *args, app=None):
    env = dict(os.environ, PGWORKER_DSN=pg_dsn, PGWORKER_SCHEMA=schema, PGWORKER_ACTOR="tester@ci")
    cmd = [sys.executable, "-m", "pgworker.cli", *args] + (["--app", app] if app else [])
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- per-key ordering ---------------------------------------------------------------


def test_two_pods_hammering_four_keys_never_overlap_a_key(env, pg_dsn, conn):
    schema = env.settings.schema
    specs = []
    for n in range(15):
        for k in ("a", "b", "c", "d"):
            specs.append({"task": "keyed", "payload": {"key": k, "seconds": 0.02, "fail_first": n % 5 == 2},
                          "ordering_key": k})
    specs += [{"task": "keyed", "payload": {"key": None, "seconds": 0.01}} for _ in range(20)]
    ids = env.enqueue_many(specs)
    with ExitStack() as stack:
        for pod in ("p1", "p2"):
            stack.enter_context(Worker(pg_dsn, schema, "--concurrency", "3", "--batch-size", "4", *FAST, name=pod))
        wait_until(lambda: finished(conn, schema, len(ids)), 120, message="every job finished")
    assert dict(q(conn, schema, "SELECT state::text, count(*) FROM {s}.jobs GROUP BY 1")) == {"succeeded": len(ids)}
    spans = intervals(conn, schema)
    assert len({s[4] for s in spans if s[4]}) == 4
    assert len({pid for (pid,) in q(conn, schema, "SELECT DISTINCT pid FROM {s}.ledger")}) > 2  # several claimers
    for key in "abcd":
        mine = sorted((s for s in spans if s[4] == key), key=lambda s: s[2])
        for before, after in zip(mine, mine[1:]):
            assert after[2] > before[3], f"key {key}: job {after[0]} started before job {before[0]} ended"
        succeeded = [s[0] for s in mine if s[1] == 2 or not q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE "
                                                                         "job_id = %s AND event = 'fail'", s[0])]
        assert [j for j in dict.fromkeys(s[0] for s in mine)] == sorted(set(succeeded)), f"key {key} out of order"
    assert max_overlap([s for s in spans if s[4] is None] + [s for s in spans if s[4]]) > 1  # real concurrency


def test_a_dead_head_shows_in_status_and_metrics_until_replayed(env, pg_dsn, conn):
    schema = env.settings.schema
    head = env.enqueue("keyed", {"key": "k", "fail_first": True}, ordering_key="k", max_attempts=1)
    rest = [env.enqueue("keyed", {"key": "k"}, ordering_key="k") for _ in range(3)]
    other = env.enqueue("keyed", {"key": "o"}, ordering_key="o")
    port = free_port()
    with Worker(pg_dsn, schema, "--concurrency", "2", "--metrics-port", str(port), *FAST) as w:
        wait_until(lambda: q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", other) == [("succeeded",)]
                   and q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", head) == [("dead",)], 60)
        status = cli(pg_dsn, schema, "status")
        assert status.returncode == 0 and "held by a dead job" in status.stdout and str(head) in status.stdout
        metrics = wait_until(lambda: (lambda t: 'pgworker_queue_dead_blocked_ordering_keys{queue="default"} 1.0' in t
                                      and t)(requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text),
                             30, message="the dead-blocked-keys gauge")
        assert 'pgworker_queue_jobs{queue="default",state="blocked"} 3.0' in metrics
        assert {r[0] for r in q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = ANY(%s)", rest)} == {"pending"}
        replay = cli(pg_dsn, schema, "dead", "replay", str(head))
        assert replay.returncode == 0, replay.stderr
        wait_until(lambda: finished(conn, schema, 5), 60, message="the key drained after the replay")
        assert w.stop() == 0
    order = [r[0] for r in q(conn, schema, "SELECT job_id FROM {s}.ledger WHERE note = 'k' AND event = 'end' ORDER BY at")]
    assert order == [head] + rest


# -- queue limits -------------------------------------------------------------------


def test_global_concurrency_limit_holds_across_three_pods(env, pg_dsn, conn):
    schema = env.settings.schema
    env.configure_queue("limited", concurrency_limit=2)
    env.enqueue_many([("limited", {"seconds": 0.15}) for _ in range(30)])
    with RunningSampler(pg_dsn, schema, "limited") as sampler, ExitStack() as stack:
        for pod in ("p1", "p2", "p3"):
            stack.enter_context(Worker(pg_dsn, schema, "--concurrency", "2", "--queues", "limited", *FAST, name=pod))
        wait_until(lambda: finished(conn, schema, 30), 120, message="every limited job finished")
    assert max(sampler.samples) <= 2 and 2 in sampler.samples
    spans = intervals(conn, schema)
    assert len(spans) == 30 and max_overlap(spans) <= 2
    assert len({r[0] for r in q(conn, schema, "SELECT split_part(lease_owner, ':', 2) FROM {s}.jobs")}) >= 1


def test_rate_limit_across_three_pods_is_a_token_bucket(env, pg_dsn, conn):
    schema = env.settings.schema
    rate, burst, n = 8.0, 4.0, 40
    env.configure_queue("limited", rate_limit=rate, burst=burst)
    env.enqueue_many([("limited", None) for _ in range(n)])
    with ExitStack() as stack:
        for pod in ("p1", "p2", "p3"):
            stack.enter_context(Worker(pg_dsn, schema, "--concurrency", "2", "--queues", "limited", *FAST, name=pod))
        wait_until(lambda: finished(conn, schema, n), 120, message="every rate-limited job finished")
    times = sorted(r[0] for r in q(conn, schema, "SELECT extract(epoch FROM started_at)::float8 FROM {s}.jobs"))
    # the bucket's guarantee, on the database clock it runs on: in any window, at most
    # burst + rate x window claims
    for i in range(len(times)):
        for j in range(i, len(times)):
            assert j - i + 1 <= burst + rate * (times[j] - times[i]) + 1e-6
    achieved = (n - burst) / (times[-1] - times[0])
    print(f"rate limit {rate}/s, burst {burst}: achieved {achieved:.2f} jobs/s after the burst")
    # the limiter must not starve the queue either (unlimited, these claimers do ~100x this rate)
    assert achieved >= 0.3 * rate


def test_per_pod_queue_concurrency(env, pg_dsn, conn):
    schema = env.settings.schema
    env.enqueue_many([("limited", {"seconds": 0.3}) for _ in range(8)] +
                     [("other_queue", {"seconds": 0.3}) for _ in range(8)])
    args = ["--concurrency", "4", "--queues", "limited,other", "--queue-concurrency", "limited=1", *FAST]
    with RunningSampler(pg_dsn, schema, "limited") as limited, RunningSampler(pg_dsn, schema, "other") as other:
        with Worker(pg_dsn, schema, *args, name="pod"):
            wait_until(lambda: finished(conn, schema, 16), 120, message="both queues drained")
    assert max(limited.samples) == 1
    assert max(other.samples) >= 2  # the other claimers were not held back
    env.enqueue_many([("limited", {"seconds": 0.3}) for _ in range(8)])
    with RunningSampler(pg_dsn, schema, "limited") as two_pods, ExitStack() as stack:
        for pod in ("p1", "p2"):
            stack.enter_context(Worker(pg_dsn, schema, *args, name=pod))
        wait_until(lambda: finished(conn, schema, 24), 120, message="the second round drained")
    assert max(two_pods.samples) <= 2 and 2 in two_pods.samples


# -- pause --------------------------------------------------------------------------


def test_a_drain_run_says_what_a_paused_queue_leaves(env, pg_dsn, conn):
    """`left` counts what a claim could take: a drain beside a paused queue's due jobs
    said "left": 0 and exited 0 without a word (a new user's trial). Now the summary
    counts them apart (left_paused) and the log names the queue and the resume command."""
    schema = env.settings.schema
    env.pause_queue("held")
    held = [env.enqueue("record", queue="held") for _ in range(2)]
    done = env.enqueue("record", queue="limited")
    with Worker(pg_dsn, schema, "--drain", "--concurrency", "1", "--queues", "limited,held", *FAST) as w:
        assert w.wait(60) == 0, w.logs()[-3000:]
        summary = json.loads(w.stdout().strip().splitlines()[-1])
        logs = w.logs()
    assert (summary["result"], summary["left"], summary["left_paused"]) == ("succeeded", 0, 2), summary
    assert "drain: paused queue(s) 'held' (2 due): no run claims their jobs until resumed " \
           f"(`pgworker queue resume held --schema {schema}`)" in logs, logs[-3000:]
    assert env.get_job(done)["state"] == "succeeded"
    assert [env.get_job(j)["state"] for j in held] == ["pending", "pending"]


def test_pause_lets_running_jobs_finish_and_stops_every_pod_claiming(env, pg_dsn, conn):
    schema = env.settings.schema
    poll = 0.3
    first = env.enqueue_many([("limited", {"seconds": 1.0}) for _ in range(2)])
    with ExitStack() as stack:
        for pod in ("p1", "p2"):
            stack.enter_context(Worker(pg_dsn, schema, "--concurrency", "1", "--batch-size", "1",
                                       "--queues", "limited", "--poll-interval", str(poll), name=pod))
        wait_until(lambda: len(q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE event = 'start'")) == 2, 60)
        paused = cli(pg_dsn, schema, "queue", "pause", "limited")
        assert paused.returncode == 0 and "paused" in paused.stdout, paused.stderr
        later = env.enqueue_many([("limited", {"seconds": 0.0}) for _ in range(5)])  # enqueues go on
        wait_until(lambda: {r[0] for r in q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = ANY(%s)",
                                            first)} == {"succeeded"}, 60, message="running jobs finished")
        [(paused_at,)] = q(conn, schema, "SELECT paused_at FROM {s}.queues WHERE name = 'limited'")
        # wait a few poll intervals (each pod claims at least once per interval meanwhile)
        wait_until(lambda: q(conn, schema, "SELECT now() > %s + interval '1.5 seconds'", paused_at)[0][0], 10)
        starts = [r[0] for r in q(conn, schema, "SELECT at FROM {s}.ledger WHERE event = 'start'")]
        assert len(starts) == 2 and all(t < paused_at for t in starts)
        assert q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE id = ANY(%s) AND state = 'pending'", later) == [(5,)]
        resumed = cli(pg_dsn, schema, "queue", "resume", "limited")
        assert resumed.returncode == 0, resumed.stderr
        wait_until(lambda: finished(conn, schema, 7), 60, message="the backlog ran after the resume")
    events = cli(pg_dsn, schema, "queue", "events", "limited", "--json")
    assert [(e["kind"], e["actor"]) for e in json.loads(events.stdout)] == [("resumed", "tester@ci"),
                                                                            ("paused", "tester@ci")]


# -- cancellation and handler control ---------------------------------------------------


def test_cancellation_of_pending_and_running_jobs(env, pg_dsn, conn):
    schema = env.settings.schema
    sync_job = env.enqueue("cooperative_cancel")
    async_job = env.enqueue("async_cancel")
    ignoring = env.enqueue("ignores_cancel")
    pending = env.enqueue("record", delay=3600)
    out = cli(pg_dsn, schema, "cancel", str(pending))
    assert out.returncode == 0 and "cancelled" in out.stdout
    assert env.get_job(pending)["state"] == "cancelled"  # at once, no worker involved
    with Worker(pg_dsn, schema, "--concurrency", "3", "--batch-size", "1", "--lease", "3", *FAST) as w:
        wait_until(lambda: len(q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE event = 'start'")) == 3, 60)
        out = cli(pg_dsn, schema, "cancel", str(sync_job))
        assert out.returncode == 0 and "requested" in out.stdout, out.stderr
        # what happens next, and that a sync handler must call ctx.check() (a new user's
        # handler read the flag and returned: the job ended succeeded)
        assert "within a third of the lease" in out.stdout and "ctx.check()" in out.stdout, out.stdout
        assert f"pgworker jobs show {sync_job} --schema {schema}`" in out.stdout, out.stdout
        assert env.cancel(async_job) == "running"
        assert env.cancel(ignoring) == "running"
        # a renewal after the request carried it to the worker (heartbeat_at is the renewal's)
        wait_until(lambda: q(conn, schema, "SELECT heartbeat_at > cancel_requested_at FROM {s}.jobs WHERE id = %s",
                             ignoring)[0][0], 30, message="a renewal after the cancellation request")
        q(conn, schema, "INSERT INTO {s}.ledger (job_id, event) VALUES (%s, 'go') RETURNING id", ignoring)
        wait_until(lambda: finished(conn, schema, 4), 60, message="the three running jobs ended")
        assert w.stop() == 0
    assert env.get_job(sync_job)["state"] == "cancelled"
    assert env.get_job(async_job)["state"] == "cancelled"
    assert env.get_job(ignoring)["state"] == "succeeded"  # it did its work; the request came too late
    events = {r[0] for r in q(conn, schema, "SELECT event FROM {s}.ledger")}
    assert {"cancel_seen", "task_cancelled"} <= events
    assert q(conn, schema, "SELECT note FROM {s}.ledger WHERE job_id = %s AND event = 'end'", ignoring) == \
        [("cancel requested",)]
    assert [e["kind"] for e in env.get_job(sync_job)["events"]] == ["cancel_requested"]


def test_retry_after_and_a_returned_snooze(env, pg_dsn, conn):
    schema = env.settings.schema
    retried = env.enqueue("retry_after", 0.5)
    snoozed = env.enqueue("snooze_returned")
    with Worker(pg_dsn, schema, "--concurrency", "2", *FAST):
        wait_until(lambda: finished(conn, schema, 2), 60)
    assert q(conn, schema, "SELECT state::text, attempts FROM {s}.jobs WHERE id = %s", retried) == [("succeeded", 2)]
    runs = [r[0] for r in q(conn, schema, "SELECT at FROM {s}.ledger WHERE job_id = %s ORDER BY at", retried)]
    assert (runs[1] - runs[0]).total_seconds() >= 0.5  # not before the delay it asked for
    assert env.get_job(retried)["errors"][0]["code"] == "RETRY"
    assert q(conn, schema, "SELECT state::text, attempts FROM {s}.jobs WHERE id = %s", snoozed) == [("succeeded", 1)]
    assert len(q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE job_id = %s", snoozed)) == 2


# -- priority aging -----------------------------------------------------------------


def test_aging_a_low_priority_job_starts_within_the_bound_of_a_flood(env, pg_dsn, conn):
    """One low-priority job, then a flood of high-priority jobs (about 8 s of work for the
    pod, and more keeps coming). With an aging bound of 1 s the low job must not wait for
    the flood: every claim that starts once it is overdue takes it first."""
    schema = env.settings.schema
    bound = 1.0
    env.configure_queue("default", aging=bound)
    stop = threading.Event()

    def flood():
        while not stop.wait(0.1):
            env.enqueue_many([{"task": "prio", "payload": {"seconds": 0.02}, "priority": 10} for _ in range(10)])

    feeder = threading.Thread(target=flood)
    with Worker(pg_dsn, schema, "--concurrency", "2", "--batch-size", "2", *FAST):
        warm = env.enqueue("record")  # the pod is up and claiming before the flood starts
        wait_until(lambda: q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", warm)
                   == [("succeeded",)], 60, message="the pod started")
        # the low job and the first wave of the flood commit together (one transaction)
        low, *_ = env.enqueue_many([{"task": "prio", "payload": {"seconds": 0.02}, "priority": -10}] +
                                   [{"task": "prio", "payload": {"seconds": 0.02}, "priority": 10}] * 400)
        feeder.start()
        try:
            wait_until(lambda: q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", low)
                       == [("succeeded",)], 120, message="the low-priority job ran")
        finally:
            stop.set()
            feeder.join()
    [(run_at, started)] = q(conn, schema, "SELECT run_at, started_at FROM {s}.jobs WHERE id = %s", low)
    overdue = q(conn, schema, "SELECT %s::timestamptz + make_interval(secs => %s)", run_at, bound)[0][0]
    # no claim that started once the job was overdue took a newer job before it (a claim
    # running at the same instant may have found it locked by the one that took it)
    late = q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE id > %s AND started_at > %s "
                           "AND started_at < %s - interval '0.5 seconds'", low, overdue, started)[0][0]
    assert late == 0
    waited = (started - run_at).total_seconds()
    ahead = q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE id > %s AND started_at < %s", low, started)[0][0]
    left = q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE state = 'pending'")[0][0]
    print(f"low-priority job waited {waited:.2f} s (bound {bound} s); {ahead} newer high-priority jobs "
          f"ran before it, {left} still pending")
    assert ahead > 0 and left > 0  # it really was a flood that strict priority would have starved it in


# -- periodic jobs ------------------------------------------------------------------


def owe_a_slot(app_ref, dsn, schema):
    """Record the schedule app's schedules as a dispatcher would, then pretend the last
    two minutes passed with no dispatcher running, so one 'tick' slot is owed."""
    from pgworker import App
    from pgworker.loader import load_app
    from pgworker.schedules import Scheduler

    declared = load_app(app_ref).schedules
    app = App(dsn, schema=schema)
    with app.connection() as c:
        Scheduler(app.store, list(declared.values())).register(c)
        q(c, schema, "UPDATE {s}.schedules SET last_slot = last_slot - interval '2 minutes' "
                     "WHERE name = 'tick' RETURNING name")
        [(owed,)] = q(c, schema, "SELECT last_slot + interval '2 minutes' FROM {s}.schedules WHERE name = 'tick'")
    app.close()
    return owed


def test_periodic_slot_enqueued_once_by_two_dispatchers(env, pg_dsn, conn):
    schema = env.settings.schema
    owed = owe_a_slot(SCHEDULE_APP, pg_dsn, schema)
    with ExitStack() as stack:
        for pod in ("p1", "p2"):
            stack.enter_context(Worker(pg_dsn, schema, "--concurrency", "1", *FAST, app=SCHEDULE_APP, name=pod))
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE event = 'tick'"), 60,
                   message="the owed slot ran")
    rows = q(conn, schema, "SELECT schedule_slot, count(*) FROM {s}.jobs WHERE schedule_name = 'tick' GROUP BY 1")
    assert all(n == 1 for _, n in rows)  # one job per slot, whatever the dispatchers did
    assert owed in {slot for slot, _ in rows}
    assert q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE schedule_name = 'nightly'") == [(0,)]
    out = cli(pg_dsn, schema, "schedules", "--json", app=SCHEDULE_APP)
    assert out.returncode == 0, out.stderr
    listed = {r["name"]: r for r in json.loads(out.stdout)}
    assert set(listed) == {"tick", "nightly"}
    assert listed["tick"]["next_run"] and listed["nightly"]["timezone"] == "America/New_York"
    assert listed["nightly"]["missed"] == "skip" and listed["tick"]["declared"] == "yes"


def test_drain_run_fires_due_slots_at_start_and_runs_them(env, pg_dsn, conn):
    schema = env.settings.schema
    owe_a_slot(SCHEDULE_APP, pg_dsn, schema)
    with Worker(pg_dsn, schema, "--drain", "--concurrency", "1", app=SCHEDULE_APP) as w:
        assert w.wait(60) == 0
        summary = json.loads(w.stdout().strip().splitlines()[-1])
    assert summary["succeeded"] >= 1
    assert q(conn, schema, "SELECT count(*) FROM {s}.ledger WHERE event = 'tick'")[0][0] >= 1


BROKEN_SCHEDULE_APP = os.path.join(HERE, "apps", "broken_schedule_app.py") + ":app"


def test_a_failing_schedule_never_stops_the_others_of_a_real_worker(env, pg_dsn, conn):
    """One schedule whose slots cannot be computed and one whose row the database refuses,
    declared before the healthy one is fired: the worker still fires it (an always-on run
    and a drain run), logs each broken one once with its name and the fix, and counts them
    in pgworker_schedule_errors_total. Before, the first error ended every registration
    pass, so no schedule of the app fired, pass after pass."""
    from obs import free_port as metrics_port, total, wait_for_metrics
    from pgworker import App
    from pgworker.loader import load_app
    from pgworker.schedules import Scheduler

    schema = env.settings.schema
    conn.execute(psycopg.sql.SQL(
        "CREATE FUNCTION {s}.refuse_schedule() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "RAISE EXCEPTION 'schedule % is not on the reviewed list', NEW.name; END $$; "
        "CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON {s}.schedules FOR EACH ROW "
        "WHEN (NEW.name = 'b-refused') EXECUTE FUNCTION {s}.refuse_schedule()").format(s=psycopg.sql.Identifier(schema)))
    # 'tick' is owed a slot: recorded alone (as an earlier release would have), two minutes back
    declared = load_app(BROKEN_SCHEDULE_APP).schedules
    assert list(declared) == ["tick", "a-no-slot", "b-refused"]
    recorder = App(pg_dsn, schema=schema)
    with recorder.connection() as c:
        Scheduler(recorder.store, [declared["tick"]]).register(c)
    recorder.close()

    def owe_tick():
        q(conn, schema, "UPDATE {s}.schedules SET last_slot = last_slot - interval '2 minutes' "
                        "WHERE name = 'tick' RETURNING name")

    def ticks():
        return q(conn, schema, "SELECT count(*) FROM {s}.ledger WHERE event = 'tick'")[0][0]

    owe_tick()
    port = metrics_port()
    with Worker(pg_dsn, schema, "--concurrency", "1", *FAST, "--metrics-port", str(port),
                app=BROKEN_SCHEDULE_APP) as w:
        wait_until(lambda: ticks() >= 1, 60, message=lambda: "the owed slot ran; log:\n" + w.logs()[-3000:])
        wait_for_metrics(port, lambda t: total(t, "pgworker_schedule_errors_total") >= 2,
                         message="both broken schedules counted")
        w.stop()
        logs = w.logs()
    errors = [line for line in logs.splitlines() if " ERROR " in line and "schedule " in line]
    [no_slot] = [line for line in errors if "schedule 'a-no-slot'" in line]
    assert "could not be recorded: CroniterBadDateError" in no_slot and "the other schedules go on" in no_slot
    assert "correct its declaration in the app's code (cron '0 0 30 2 *' in 'UTC')" in no_slot
    [refused] = [line for line in errors if "schedule 'b-refused'" in line]
    assert "could not be recorded: RaiseException: schedule b-refused is not on the reviewed list" in refused
    assert f'the database refused to record it in "{schema}".schedules (a trigger' in refused
    assert not [line for line in errors if "'tick'" in line]
    assert q(conn, schema, "SELECT name FROM {s}.schedules") == [("tick",)]  # neither broken one was recorded
    # a drain run fires the due slot at start the same way
    before = ticks()
    q(conn, schema, "DELETE FROM {s}.jobs WHERE schedule_name = 'tick' RETURNING id")  # its slots' keys free again
    owe_tick()
    # and fails (exit 1, "failed", the broken ones named in its summary): the break-it
    # trial's drain said "succeeded" and exited 0, so a CronJob looked healthy while two
    # schedules never fired
    with Worker(pg_dsn, schema, "--drain", "--concurrency", "1", app=BROKEN_SCHEDULE_APP) as w:
        assert w.wait(60) == 1, w.logs()
        drain_logs = w.logs()
        summary = json.loads(w.stdout().strip().splitlines()[-1])
    assert ticks() == before + 1, drain_logs
    assert summary["result"] == "failed" and summary["succeeded"] == 1, summary
    [failed] = summary["maintenance_failed"]
    assert failed.startswith("scheduler: schedule(s) a-no-slot, b-refused could not be recorded or fired"), failed


def test_queue_and_dead_keys_commands(env, pg_dsn, conn):
    schema = env.settings.schema
    out = cli(pg_dsn, schema, "queue", "set", "emails", "--concurrency", "3", "--rate", "5", "--burst", "10", "--json")
    assert out.returncode == 0, out.stderr
    assert {k: json.loads(out.stdout)[k] for k in ("concurrency_limit", "rate_per_second", "rate_burst")} == \
        {"concurrency_limit": 3, "rate_per_second": 5.0, "rate_burst": 10.0}
    out = cli(pg_dsn, schema, "queue", "set", "emails", "--concurrency", "none", "--aging", "2m", "--json")
    row = json.loads(out.stdout)
    assert (row["concurrency_limit"], row["rate_per_second"], row["aging_seconds"]) == (None, 5.0, 120.0)
    refused = cli(pg_dsn, schema, "queue", "set", "emails")
    assert refused.returncode == 1 and "nothing to set" in refused.stderr and "Traceback" not in refused.stderr
    assert cli(pg_dsn, schema, "queue", "pause", "emails").returncode == 0
    env.enqueue("record", queue="emails")
    status = json.loads(cli(pg_dsn, schema, "status", "--json").stdout)
    assert [(r["queue"], r["state"], r["paused"]) for r in status] == [("emails", "due", True)]
    listed = json.loads(cli(pg_dsn, schema, "queue", "list", "--json").stdout)
    assert [(r["name"], r["paused_by"]) for r in listed] == [("emails", "tester@ci")]
    head = env.enqueue("t", ordering_key="k", max_attempts=1, any_task=True)
    env.enqueue("t", ordering_key="k", any_task=True)
    [job] = env.claim()
    env.fail(job, RuntimeError("boom"))
    keys = json.loads(cli(pg_dsn, schema, "dead", "keys", "--json").stdout)
    assert [(k["ordering_key"], k["dead_job_id"], k["waiting"]) for k in keys] == [("k", head, 1)]


def test_a_handler_reporting_progress_sees_a_cancel_at_its_next_progress_write(env, pg_dsn, conn):
    """The lease is 60 s (a renewal every 20 s): the cancel reaches the handler through its
    own progress write (at most one a second), and the job ends cancelled within seconds."""
    import time

    schema = env.settings.schema
    job = env.enqueue("progress_cancel")
    with Worker(pg_dsn, schema, "--concurrency", "1", "--lease", "60", *FAST) as w:
        wait_until(lambda: q(conn, schema, "SELECT progress IS NOT NULL FROM {s}.jobs WHERE id = %s", job)[0][0],
                   60, message="the handler reported progress")
        asked = time.monotonic()
        out = cli(pg_dsn, schema, "cancel", str(job))
        assert out.returncode == 0 and "requested" in out.stdout and "ctx.progress" in out.stdout, out.stdout
        wait_until(lambda: env.get_job(job)["state"] != "running", 15, message="the job ended")
        took = time.monotonic() - asked
        assert w.stop() == 0
    assert env.get_job(job)["state"] == "cancelled"
    assert took < 8, f"the cancel took {took:.1f} s to reach a handler writing progress every second"


def test_a_jobs_last_progress_report_is_kept_when_it_ends(env, pg_dsn, conn):
    """Six progress calls in well under a second: the throttle writes the first and holds
    the others back; the last one is written when the handler ends, success or failure."""
    schema = env.settings.schema
    ok = env.enqueue("progress_steps", {})
    failed = env.enqueue("progress_steps", {"fail": True})
    with Worker(pg_dsn, schema, "--concurrency", "2", *FAST) as w:
        wait_until(lambda: finished(conn, schema, 2), 60)
        assert w.stop() == 0
    for job_id, state in ((ok, "succeeded"), (failed, "dead")):
        job = env.get_job(job_id)
        assert job["state"] == state
        assert (job["progress"], job["progress_message"]) == (1.0, "step 6/6"), job_id
