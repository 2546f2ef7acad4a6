"""Hostile input meeting a real `pgworker run`: rows inserted by raw SQL that no handler
can decode, task names with control characters, handlers raising huge, binary and
unprintable exceptions, and a DSN with a password that must never be printed anywhere."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request

import psycopg
import pytest

from pg import wait_until
from pgcluster import Cluster, free_port, missing_tools, require
from worker import HERE, Worker, knowing, q

pytestmark = pytest.mark.acceptance

HOSTILE_APP = os.path.join(HERE, "apps", "hostile_app.py") + ":app"
sys.path.insert(0, os.path.join(HERE, "apps"))
import hostile_app  # noqa: E402


@pytest.fixture
def env(app, pg_dsn):
    return knowing(app, pg_dsn, HOSTILE_APP)


def finished(conn, schema, n):
    return q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE state IN ('succeeded', 'dead')")[0][0] == n


def test_hostile_names_undecodable_rows_and_exceptions_end_dead_with_a_code(env, pg_dsn, conn):
    schema = env.settings.schema
    good = env.enqueue_many([("noop", i) for i in range(50)])
    weird = env.enqueue(hostile_app.WEIRD_TASK, {"a": "'; DROP TABLE x; --"})
    long_ = env.enqueue(hostile_app.LONG_TASK, None)
    raisers = {kind: env.enqueue("raise", kind) for kind in hostile_app.RAISERS if kind != "secret"}
    raw = {}
    for label, task, payload in [
        ("deep", "record", "[" * 5000 + "]" * 5000),          # PostgreSQL stores it, Python cannot decode it
        ("control_task", "evil\x1b[31m\nFORGED ERROR pgworker: injected", "1"),
        ("null_payload", "record", "null"),
        ("unicode_payload", "record", '"\\u202e\\u0007 bell and bidi"'),  # JSON escapes
    ]:
        raw[label] = q(conn, schema, "INSERT INTO {s}.jobs (queue, task, payload) VALUES ('default', %s, %s) "
                                     "RETURNING id", task, payload)[0][0]
    total = len(good) + 2 + len(raisers) + len(raw)
    with Worker(pg_dsn, schema, "--concurrency", "2", "--poll-interval", "0.5s", app=HOSTILE_APP) as w:
        wait_until(lambda: finished(conn, schema, total), 120,
                   message=lambda: f"every job finished; log:\n{w.logs()[-4000:]}")
        assert w.stop() == 0
        logs = w.logs()
    state = {r[0]: r[1:] for r in q(conn, schema, "SELECT id, state::text, last_error_code, errors FROM {s}.jobs")}
    assert all(state[i][0] == "succeeded" for i in good)  # the rest of the queue was unaffected
    assert state[weird][0] == state[long_][0] == "succeeded"
    assert state[raw["deep"]][:2] == ("dead", "PAYLOAD_INVALID")
    assert state[raw["control_task"]][:2] == ("dead", "UNKNOWN_TASK")
    assert state[raw["null_payload"]][0] == state[raw["unicode_payload"]][0] == "succeeded"
    for kind, job_id in raisers.items():
        st, code, errors = state[job_id]
        assert st == "dead" and code, (kind, st, code)
        message = errors[-1]["message"]
        assert 0 < len(message) <= env.settings.error_message_max_chars, (kind, len(message))
        assert "\x00" not in message and "\x1b" not in message and "\ud800" not in message
    assert state[raisers["coded"]][1].endswith(".CodedError")  # the unusable code was ignored
    assert "__str__" not in state[raisers["bad_str"]][2][-1]["message"] or "unprintable" in \
        state[raisers["bad_str"]][2][-1]["message"]
    # no forged log lines, no terminal escapes, no megabytes of exception text in the logs
    assert not re.search(r"^FORGED", logs, re.M), logs[-3000:]
    assert "\x1b" not in logs and "x" * 5000 not in logs
    assert "'; DROP TABLE x; --" not in logs  # payloads are never logged


@pytest.fixture
def secret_cluster():
    require(missing_tools())
    c = Cluster(auth="scram-sha-256", password="Sup3r-Secret-Admin")
    c.start()
    yield c
    c.destroy()


PASSWORD = "Zq7-s3cr3t-Pw_4823"


def test_a_password_in_the_dsn_is_never_printed(secret_cluster, tmp_path):
    c = secret_cluster
    c.execute(f"CREATE ROLE app LOGIN PASSWORD '{PASSWORD}'")
    c.execute("GRANT CREATE ON DATABASE postgres TO app")
    url = c.dsn("app", PASSWORD)
    kv = f"host=127.0.0.1 port={c.port} dbname=postgres user=app password='{PASSWORD}'"
    wrong = c.dsn("app", PASSWORD + "-wrong")
    unreachable = f"postgresql://app:{PASSWORD}@127.0.0.1:{free_port()}/postgres"
    schema = "secret"
    env = {**os.environ, "PGWORKER_SCHEMA": schema, "OTEL_TRACES_EXPORTER": "console", "SECRET_PASSWORD": PASSWORD}
    env.pop("PGWORKER_DSN", None)
    outputs = []

    def cli(*args, dsn=url):
        out = subprocess.run([sys.executable, "-m", "pgworker.cli", *args, "--dsn", dsn], env=env,
                             capture_output=True, text=True, timeout=120)
        outputs.append(out.stdout + out.stderr)
        return out

    assert cli("migrate").returncode == 0
    assert cli("migrate", dsn=kv).returncode == 0
    assert cli("status").returncode == 0
    for bad in (wrong, unreachable, url.replace("/postgres", "/nodb"), kv + " sslmode=bogus", "postgresql://app:" +
                PASSWORD + "@[::1"):
        r = cli("status", dsn=bad)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "password authentication failed" in "".join(outputs)
    for kind in ("secret", "huge", "unprintable"):
        assert cli("enqueue", "raise", "--payload", f'"{kind}"').returncode == 0
    job_ids = [int(cli("enqueue", "noop", "--payload", "1").stdout.strip()) for _ in range(3)]

    with psycopg.connect(c.admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE TABLE "{schema}".ledger (id bigserial, idempotency_key text, job_id bigint, '
                      'attempt int, lease_token bigint, event text, pid int)')
        admin.execute(f'GRANT ALL ON ALL TABLES IN SCHEMA "{schema}" TO app')
        admin.execute(f'GRANT ALL ON ALL SEQUENCES IN SCHEMA "{schema}" TO app')
    port = free_port()
    with Worker(url, schema, "--concurrency", "1", "--metrics-port", str(port), "--metrics-host", "127.0.0.1",
                "--poll-interval", "0.5s", app=HOSTILE_APP,
                env={"OTEL_TRACES_EXPORTER": "console", "SECRET_PASSWORD": PASSWORD, "LEDGER_DSN": url}) as w:
        with psycopg.connect(c.admin_dsn) as admin:
            wait_until(lambda: finished(admin, schema, 6), 90, message=lambda: w.logs()[-3000:])
            stored = "".join(str(r) for r in q(admin, schema, "SELECT * FROM {s}.jobs"))
            sessions = str(admin.execute("SELECT application_name, query FROM pg_stat_activity").fetchall())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            metrics = r.read().decode()
        for path in ("/readyz", "/healthz", "/nope"):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
                    metrics += r.read().decode()
            except urllib.error.HTTPError as exc:
                metrics += exc.read().decode()
        assert w.stop() == 0
        spans = w.stdout()
        logs = w.logs()
    # a worker that cannot log in says why, without the password
    bad_worker = Worker(wrong, schema, "--concurrency", "1", app=HOSTILE_APP)
    wait_until(lambda: "password authentication failed" in bad_worker.logs(), 60, message=bad_worker.logs)
    bad_worker.kill()
    bad_logs = bad_worker.logs()
    bad_worker.log.close()

    assert "messaging.destination.name" in spans or '"name"' in spans  # spans were exported
    assert "pgworker_jobs_finished_total" in metrics
    assert "RuntimeError" in stored  # the secret-bearing failure was stored...
    everything = {"cli": "".join(outputs), "logs": logs, "bad_worker_logs": bad_logs, "metrics": metrics,
                  "spans": spans, "stored": stored, "sessions": sessions}
    for where, text in everything.items():
        assert PASSWORD not in text, f"the password leaked into {where}"  # ...without the password
    assert "********" in stored
    assert len(job_ids) == 3
