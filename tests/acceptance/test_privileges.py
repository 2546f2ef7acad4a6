"""Least privilege, shown by connecting as each role (a throwaway cluster, so roles come
and go freely): the owner migrates; `pgworker sql grants` gives a producer that can only
enqueue and read job state, and a worker that can claim, record outcomes and reap, and
neither can do more. Payloads are not logged; the metrics endpoint binds where told."""

from __future__ import annotations

import functools
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import psycopg
import pytest
from psycopg import errors

import pgworker
from pg import wait_until
from pgcluster import Cluster, free_port, missing_tools, require
from worker import ACCEPTANCE_APP, Worker

pytestmark = pytest.mark.acceptance
SCHEMA = "app jobs"  # a schema name that needs quoting, on purpose


@pytest.fixture(scope="module")
def cluster():
    require(missing_tools())
    c = Cluster()
    c.start()
    for role in ("owner", "producer", "worker"):
        c.execute(f'CREATE ROLE "{role}" LOGIN')
    c.execute('GRANT CREATE ON DATABASE postgres TO "owner"')
    yield c
    c.destroy()


def cli(*args, dsn):
    return subprocess.run([sys.executable, "-m", "pgworker.cli", *args, "--dsn", dsn, "--schema", SCHEMA],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def granted(cluster):
    owner = cluster.dsn("owner")
    assert cli("migrate", dsn=owner).returncode == 0
    printed = cli("sql", "grants", "--producer", "producer", "--worker", "worker", dsn=owner)
    assert printed.returncode == 0, printed.stderr
    assert 'GRANT INSERT (id, queue, task, payload' in printed.stdout and '"app jobs".jobs' in printed.stdout
    with psycopg.connect(cluster.dsn("producer")) as c:  # printing applied nothing
        with pytest.raises(errors.InsufficientPrivilege):
            c.execute('SELECT state FROM "app jobs".jobs')
    applied = cli("sql", "grants", "--producer", "producer", "--worker", "worker", "--apply", dsn=owner)
    assert applied.returncode == 0, applied.stderr
    return cluster


def readyz_text(port: int) -> str:
    """What /readyz on ``port`` says ('' while nothing serves there yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.read().decode()
    except OSError:
        return ""


def refused(dsn: str, statement: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as c:
        try:
            c.execute(statement)
        except (errors.InsufficientPrivilege, errors.WrongObjectType) as exc:
            return "permission denied" in str(exc) or "must be owner" in str(exc)
    return False


def _app(dsn):
    from pgworker import App
    from pgworker.loader import load_app

    app = App(dsn, schema=SCHEMA)
    app.tasks.update(load_app(ACCEPTANCE_APP).tasks)
    return app


def test_a_producer_can_enqueue_and_read_state_and_nothing_else(granted):
    dsn = granted.dsn("producer")
    app = _app(dsn)
    try:
        one = app.enqueue("noop", {"secret": "payload"})
        many = app.enqueue_many([("noop", i) for i in range(50)])  # COPY
        again = [app.enqueue("noop", 1, dedupe_key="once") for _ in range(2)]
        ordered = [app.enqueue("noop", i, ordering_key="k") for i in range(3)]
        assert again[0] == again[1] and len(many) == 50
        listed = app.list_jobs(limit=100)
        assert {r["id"] for r in listed} >= {one, *many, *ordered} and {r["state"] for r in listed} == {"pending"}
        for where in ("claim", "read payloads", "read errors"):
            with pytest.raises(errors.InsufficientPrivilege):
                if where == "claim":
                    app.claim("default")
                elif where == "read payloads":
                    with app.connection() as c:
                        c.execute('SELECT payload FROM "app jobs".jobs')
                else:
                    app.get_job(one)
        # pgworker's error, still psycopg's InsufficientPrivilege, the fix in its message (a
        # new user's trial: a raw InsufficientPrivilege where the CLI names `pgworker sql
        # grants`; then the fix was a note, which a log of str(exc) dropped)
        with pytest.raises(errors.InsufficientPrivilege) as refusal:
            app.cancel(one)
        assert isinstance(refusal.value, pgworker.PermissionDenied)
        assert "sql grants --producer" in str(refusal.value) and "schema's owner" in str(refusal.value)
    finally:
        app.close()
    # the read-only views an application shows its users work for the producer too
    for command in (("status",), ("queue", "list"), ("queue", "events", "default"), ("schedules",),
                    ("jobs", "list"), ("dead", "keys")):
        out = cli(*command, dsn=dsn)
        assert out.returncode == 0 and "Traceback" not in out.stderr, (command, out.stderr)
    assert "default" in cli("status", dsn=dsn).stdout
    # no queue configured: the listing says where the queues with jobs are, not "(none)"
    assert "`pgworker status` lists the queues that hold jobs" in cli("queue", "list", dsn=dsn).stdout
    s = '"app jobs".jobs'
    for stmt in (f"DELETE FROM {s}", f"TRUNCATE {s}", f"UPDATE {s} SET state = 'running'",
                 f"INSERT INTO {s} (queue, task, payload, state) VALUES ('default', 'noop', '1', 'dead')",
                 f"INSERT INTO {s} (queue, task, payload, lease_token) VALUES ('default', 'noop', '1', 9)",
                 f"DROP TABLE {s}", f"ALTER TABLE {s} ADD COLUMN x int", 'CREATE TABLE "app jobs".x (a int)',
                 'INSERT INTO "app jobs".job_events (job_id, kind) VALUES (1, \'x\')',
                 'SELECT * FROM "app jobs".job_events',
                 'SELECT "app jobs".delete_finished_jobs(ARRAY[1], 0, 0, 0)',  # the pruner's, not a producer's
                 'SELECT "app jobs".delete_queue_events(ARRAY[1], 0)'):
        assert refused(dsn, stmt), stmt
    out = cli("prune", "--older-than", "0s", dsn=dsn)
    assert out.returncode == 1 and "permission denied" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_a_worker_claims_records_outcomes_and_reaps_and_nothing_else(granted):
    owner, dsn = granted.dsn("owner"), granted.dsn("worker")
    app = _app(owner)
    app.configure_queue("limited", rate_limit=1000, burst=1000)  # the worker spends tokens of a limited queue
    limited = app.enqueue_many([("limited", None) for _ in range(5)])
    ok = app.enqueue_many([("noop", {"marker": "PAYLOAD-MARKER-4711"}) for _ in range(20)])
    failing = app.enqueue("always_fails", {"marker": "PAYLOAD-MARKER-4711"})
    with app.connection() as c:
        stale = c.execute('INSERT INTO "app jobs".jobs (queue, task, payload, state, attempts, lease_token, '
                          "lease_expires_at) VALUES ('default', 'noop', '1', 'running', 1, 1, "
                          "now() - interval '1 minute') RETURNING id").fetchone()[0]
        # history past its retention, for the pruner: a succeeded, a cancelled and a dead job
        # (the dead one heads its ordering key, a job waits behind it), and an old audit event
        old = [c.execute('INSERT INTO "app jobs".jobs (queue, task, payload, state, finished_at, ordering_key) '
                         "VALUES ('default', 'noop', '1', %s, now() - interval '30 days', %s) RETURNING id",
                         [state, key]).fetchone()[0]
               for state, key in (("succeeded", None), ("cancelled", None), ("dead", "pruned-head"))]
        behind = app.enqueue("noop", ordering_key="pruned-head")
        c.execute('''INSERT INTO "app jobs".queue_events (queue, kind, at) VALUES ('default', 'paused', now() - interval '200 days')''')
    port = free_port()
    with Worker(dsn, SCHEMA, "--concurrency", "2", "--reap-interval", "1s", "--poll-interval", "0.5s",
                "--metrics-port", str(port), "--metrics-host", "127.0.0.2",
                env={"PGWORKER_RETENTION_DEAD_SECONDS": "86400", "PGWORKER_PRUNE_INTERVAL_SECONDS": "1"}) as w:
        def done():
            return all(app.get_job(i)["state"] in ("succeeded", "dead")
                       for i in [*ok, *limited, failing, stale, behind])
        wait_until(done, 90, message=lambda: w.logs()[-3000:])
        # the metrics endpoint listens on the address it was given, and only there
        with urllib.request.urlopen(f"http://127.0.0.2:{port}/metrics", timeout=10) as r:
            assert r.status == 200 and b"pgworker_jobs_finished_total" in r.read()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        # the pruner (on by default) prunes with this role, through the owner's retention
        # functions (it once could only log an ERROR and stop): the old history goes, and the
        # job behind the pruned dead head was promoted (it ran, above)
        wait_until(lambda: all(app.get_job(i) is None for i in old), 30, message=lambda: w.logs()[-3000:])
        wait_until(lambda: not app.queue_events("default"), 30, message=lambda: w.logs()[-3000:])
        with urllib.request.urlopen(f"http://127.0.0.2:{port}/readyz", timeout=10) as r:
            assert r.status == 200
        assert w.stop() == 0
        logs = w.logs()
    assert "the pruner stops" not in logs and "permission denied" not in logs
    assert "pruner (pruning finished jobs): statement failed" not in logs
    assert app.get_job(stale)["last_error_code"] == "LEASE_EXPIRED" and app.get_job(stale)["state"] == "succeeded"
    assert app.get_job(failing)["state"] == "dead"
    assert "PAYLOAD-MARKER-4711" not in logs  # payloads are never logged by default
    s = '"app jobs".jobs'
    for stmt in (f"DROP TABLE {s}", f"ALTER TABLE {s} ADD COLUMN x int", f"DELETE FROM {s}", f"TRUNCATE {s}",
                 f"UPDATE {s} SET payload = '1'", f"UPDATE {s} SET max_attempts = 100", f"UPDATE {s} SET queue = 'x'",
                 'CREATE TABLE "app jobs".x (a int)', 'DROP SCHEMA "app jobs" CASCADE',
                 'INSERT INTO "app jobs".job_events (job_id, kind) VALUES (1, \'x\')',
                 'DELETE FROM "app jobs".migrations',
                 'UPDATE "app jobs".queues SET paused_at = NULL',  # pausing is the operator's
                 'UPDATE "app jobs".queues SET rate_per_second = 1e9',
                 'DELETE FROM "app jobs".queue_events'):
        assert refused(dsn, stmt), stmt
    # the retention functions delete only finished jobs past the retention given
    live = app.enqueue("noop")
    with psycopg.connect(dsn, autocommit=True) as c:
        assert c.execute('SELECT * FROM "app jobs".delete_finished_jobs(%s, 0, 0, 0)', [[live]]).fetchall() == []
    assert app.get_job(live)["state"] == "pending"
    # and `pgworker prune` works with this role too
    out = cli("prune", "--older-than", "0s", dsn=dsn)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert app.get_job(ok[0]) is None and app.get_job(live)["state"] == "pending"
    app.close()


def test_grants_refuse_a_missing_role_and_name_the_fix(granted):
    out = cli("sql", "grants", dsn=granted.dsn("owner"))
    assert out.returncode != 0 and "--producer" in out.stderr
    out = cli("sql", "grants", "--producer", "nobody-here", "--apply", dsn=granted.dsn("owner"))
    assert out.returncode == 1 and "nobody-here" in out.stderr and "Traceback" not in out.stderr, out.stderr
    # the fix is to create the role, not to migrate (a missing role once read as a missing schema)
    assert "create the role first" in out.stderr and "migrate" not in out.stderr, out.stderr
    # run as a role that may not grant (PGWORKER_DSN left at the worker's), PostgreSQL only
    # warns and grants nothing: it said "granted" (a new user's trial); now an error naming the owner
    granted.execute('CREATE ROLE "newcomer" LOGIN')
    out = cli("sql", "grants", "--producer", "newcomer", "--apply", dsn=granted.dsn("worker"))
    assert out.returncode == 1 and "granted on schema" not in out.stdout, out.stdout + out.stderr
    assert "role 'worker' could not grant producer 'newcomer'" in out.stderr and "schema's owner" in out.stderr
    out = cli("sql", "grants", "--producer", "newcomer", "--apply", dsn=granted.dsn("owner"))
    assert out.returncode == 0 and "granted on schema" in out.stdout, out.stderr


def test_a_role_without_the_workers_grants_is_told_so_at_start(granted):
    """A role that can read the schema but not claim (a trial: a drain run retried every
    refused claim in silence until --max-duration and exited 75): a drain run exits 1 at
    once naming what the role lacks and `pgworker sql grants --worker ROLE --apply`; an
    always-on worker waits, /readyz naming the same, and claims once the grants exist."""
    granted.execute('CREATE ROLE "reader" LOGIN')
    granted.execute(f'GRANT USAGE ON SCHEMA "{SCHEMA}" TO "reader"')
    granted.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{SCHEMA}" TO "reader"')
    owner, dsn = granted.dsn("owner"), granted.dsn("reader")
    app = _app(owner)
    job = app.enqueue("noop")
    drain = subprocess.run([sys.executable, "-m", "pgworker.cli", "run", "--drain", "--max-duration", "60",
                            "--app", ACCEPTANCE_APP, "--dsn", dsn, "--schema", SCHEMA],
                           capture_output=True, text=True, timeout=120)
    said = drain.stdout + drain.stderr
    assert drain.returncode == 1, said
    assert '"result": "failed"' in drain.stdout and "Traceback" not in said, said
    assert "role 'reader' lacks privileges a worker needs" in said and "UPDATE (state," in said, said
    assert "pgworker sql grants --worker reader --schema 'app jobs' --apply" in said, said  # pasted as printed
    assert app.get_job(job)["state"] == "pending"
    port = free_port()
    with Worker(dsn, SCHEMA, "--concurrency", "1", "--poll-interval", "0.5s", "--metrics-port", str(port)) as w:
        readyz = functools.partial(readyz_text, port)
        wait_until(lambda: "missing grants: role 'reader'" in readyz(), 30, message=lambda: w.logs()[-3000:])
        assert app.get_job(job)["state"] == "pending"
        out = cli("sql", "grants", "--worker", "reader", "--apply", dsn=owner)
        assert out.returncode == 0, out.stderr
        wait_until(lambda: app.get_job(job)["state"] == "succeeded", 60, message=lambda: w.logs()[-3000:])
        assert readyz().strip() == "ready"
        assert w.stop() == 0
        assert w.logs().count("lacks privileges a worker needs") == 1  # said once, not per retry
    app.close()


def test_a_role_granted_less_on_purpose_runs_and_is_told_what_will_fail(granted):
    """A deployment that granted less than grants.sql on purpose (no scheduler, no durable
    steps) kept working before the start-up check: what only some features need is a
    warning naming them, not a refusal; what the scheduler needs is not asked for when
    it is off (PGWORKER_SCHEDULES=false)."""
    granted.execute('CREATE ROLE "lean" LOGIN')
    out = cli("sql", "grants", "--worker", "lean", "--apply", dsn=granted.dsn("owner"))
    assert out.returncode == 0, out.stderr
    granted.execute(f'REVOKE INSERT, UPDATE ON "{SCHEMA}".schedules, "{SCHEMA}".job_steps FROM "lean"')
    app = _app(granted.dsn("owner"))
    job = app.enqueue("noop")

    def drain(**env):
        import os

        return subprocess.run([sys.executable, "-m", "pgworker.cli", "run", "--drain", "--app", ACCEPTANCE_APP,
                               "--dsn", granted.dsn("lean"), "--schema", SCHEMA], capture_output=True, text=True,
                              timeout=120, env={**os.environ, **env})
    run = drain()
    assert run.returncode == 0, run.stdout + run.stderr
    assert "role 'lean' lacks what some features need" in run.stderr and "the scheduler" in run.stderr, run.stderr
    assert "ctx.step and ctx.effect" in run.stderr and "pgworker sql grants --worker lean" in run.stderr
    assert app.get_job(job)["state"] == "succeeded"
    quiet = drain(PGWORKER_SCHEDULES="false")
    assert quiet.returncode == 0 and "the scheduler" not in quiet.stderr and "ctx.step" in quiet.stderr, quiet.stderr
    app.close()


def test_grants_revoked_while_a_worker_runs_make_it_unready_until_granted_again(granted):
    """The start's grants check cannot see grants revoked later: the claims fail (logged
    once per outage), and /readyz once said ready all along. It now names the claimer that
    cannot claim, why and the fix, after 10 s of failed claims, and is ready again once the
    grants are back; the job waiting meanwhile runs."""
    granted.execute('CREATE ROLE "revoked" LOGIN')
    owner, dsn = granted.dsn("owner"), granted.dsn("revoked")
    assert cli("sql", "grants", "--worker", "revoked", "--apply", dsn=owner).returncode == 0
    app = _app(owner)
    port = free_port()
    with Worker(dsn, SCHEMA, "--concurrency", "1", "--poll-interval", "0.5s", "--metrics-port", str(port)) as w:
        readyz = functools.partial(readyz_text, port)
        wait_until(lambda: readyz().strip() == "ready", 30, message=lambda: w.logs()[-3000:])
        granted.execute(f'REVOKE UPDATE ON "{SCHEMA}".jobs FROM "revoked"')
        job = app.enqueue("noop")
        said = wait_until(lambda: "cannot claim jobs" in (r := readyz()) and r, 60, message=lambda: w.logs()[-3000:])
        assert "claimer 0 cannot claim jobs for" in said and "permission denied for table jobs" in said, said
        assert "pgworker sql grants --worker ROLE" in said, said
        assert app.get_job(job)["state"] == "pending"
        assert cli("sql", "grants", "--worker", "revoked", "--apply", dsn=owner).returncode == 0
        wait_until(lambda: app.get_job(job)["state"] == "succeeded", 60, message=lambda: w.logs()[-3000:])
        wait_until(lambda: readyz().strip() == "ready", 30, message=readyz)
        assert w.stop() == 0
    app.close()


def test_a_claimer_that_cannot_connect_again_makes_the_pod_unready(granted):
    """A break-it trial: a claimer whose connection dropped and whose role could no longer
    log in (a rotated password, NOLOGIN, too many clients) was never named: /readyz said
    ready. Its connect failures now count as failed claims."""
    granted.execute('CREATE ROLE "relogin" LOGIN')
    owner, dsn = granted.dsn("owner"), granted.dsn("relogin")
    assert cli("sql", "grants", "--worker", "relogin", "--apply", dsn=owner).returncode == 0
    port = free_port()
    with Worker(dsn, SCHEMA, "--concurrency", "1", "--poll-interval", "0.5s", "--metrics-port", str(port)) as w:
        readyz = functools.partial(readyz_text, port)
        wait_until(lambda: readyz().strip() == "ready", 30, message=lambda: w.logs()[-3000:])
        granted.execute('ALTER ROLE "relogin" NOLOGIN')
        granted.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE usename = 'relogin' AND application_name LIKE 'pgworker:claimer:%'")
        said = wait_until(lambda: "cannot claim jobs" in (r := readyz()) and r, 60, message=lambda: w.logs()[-3000:])
        assert "claimer 0" in said and "connect:" in said and "not permitted to log in" in said, said
        granted.execute('ALTER ROLE "relogin" LOGIN')
        wait_until(lambda: readyz().strip() == "ready", 60, message=readyz)
        assert w.stop() == 0
