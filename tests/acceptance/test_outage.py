"""PostgreSQL going away under a running worker (a throwaway cluster the test owns):
the worker survives without a restart, says so once, reports not ready, does not spin,
and carries on when the server returns; a read-only server is named as such."""

from __future__ import annotations

import os
import re
import time
import urllib.error
import urllib.request

import psycopg
import pytest

from pg import wait_until
from pgcluster import Cluster, free_port, missing_tools, require
from worker import ACCEPTANCE_APP, Worker, create_ledger, q

pytestmark = pytest.mark.acceptance

OUTAGE_SECONDS = float(os.environ.get("PGWORKER_OUTAGE_SECONDS", "37"))
_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ (\w+) (\S+) (\S+): (.*)$")


def http(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of these processes (Linux /proc/<pid>/stat, clock ticks)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total / os.sysconf("SC_CLK_TCK")


def log_lines(text: str, since: float, until: float) -> list[str]:
    """WARNING and ERROR lines logged between two time.time() instants (second resolution)."""
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m or m.group(2) not in ("WARNING", "ERROR"):
            continue
        at = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))
        if since - 1 <= at <= until + 1:
            out.append(line)
    return out


@pytest.fixture
def cluster():
    require(missing_tools())
    c = Cluster()
    c.start()
    yield c
    c.destroy()


def _app(dsn: str, schema: str):
    from pgworker import App
    from pgworker.loader import load_app

    app = App(dsn, schema=schema)
    app.migrate()
    app.tasks.update(load_app(ACCEPTANCE_APP).tasks)
    create_ledger(dsn, schema)
    return app


@pytest.mark.timeout(900)
def test_worker_survives_an_outage_and_carries_on(cluster, capsys):
    dsn, schema, port = cluster.dsn(), "outage", free_port()
    app = _app(dsn, schema)
    conn = lambda: psycopg.connect(dsn, autocommit=True)  # noqa: E731
    # a long poll interval: after the outage only LISTEN (re-established) wakes the claimers quickly
    with Worker(dsn, schema, "--concurrency", "2", "--metrics-port", str(port), "--metrics-host", "127.0.0.1",
                "--poll-interval", "300s", "--reap-interval", "1s", "--lease", "6s") as w:
        wait_until(lambda: http(port, "/readyz")[0] == 200, 60, message="ready")
        app.enqueue_many([("record", i) for i in range(20)])
        with conn() as c:
            wait_until(lambda: q(c, schema, "SELECT count(*) FROM {s}.jobs WHERE state = 'succeeded'")[0][0] == 20,
                       60, message="the first jobs")
        slow = app.enqueue("sleep", {"seconds": 3})
        with conn() as c:
            wait_until(lambda: q(c, schema, "SELECT 1 FROM {s}.ledger WHERE job_id = %s", slow), 30,
                       message="the slow job started")
        pids = [w.pid, *w.claimer_pids()]

        cluster.stop("fast")
        down = time.time()
        wait_until(lambda: http(port, "/readyz")[0] == 503, 30, message="not ready during the outage")
        status, body = http(port, "/readyz")
        assert "database" in body, body
        assert http(port, "/healthz")[0] == 200  # alive: a restart would not help
        cpu0, t_cpu = cpu_seconds(pids), time.time()
        time.sleep(max(0.0, down + OUTAGE_SECONDS - time.time()))
        cpu = cpu_seconds(pids) - cpu0
        cpu_window = time.time() - t_cpu
        assert http(port, "/readyz")[0] == 503
        assert w.proc.poll() is None and sorted(pids[1:]) == sorted(w.claimer_pids())  # nothing restarted

        restart_begins = time.time()  # everything logged before this is the outage's
        cluster.start()
        up = time.time()
        wait_until(lambda: http(port, "/readyz")[0] == 200, 120,
                   message=lambda: f"ready again; log:\n{w.logs()[-3000:]}")
        ready_after = time.time() - up
        later = app.enqueue_many([("record", 100 + i) for i in range(10)])
        with conn() as c:
            wait_until(lambda: q(c, schema, "SELECT count(*) FROM {s}.jobs WHERE state = 'succeeded' AND id = ANY(%s)",
                                 later)[0][0] == 10, 120, message=lambda: f"jobs after the outage; log:\n{w.logs()[-3000:]}")
            done_after = time.time() - up
            # the job cut off by the outage was not left running: it finished, or waits for
            # its retry (due later; with this poll interval only a wake-up would claim it)
            wait_until(lambda: q(c, schema, "SELECT state::text = 'succeeded' OR (state = 'pending' AND attempts >= 1 "
                                            "AND last_error_code IS NOT NULL) FROM {s}.jobs WHERE id = %s", slow)[0][0],
                       120, message=lambda: f"the job cut off by the outage was settled: "
                                            f"{q(c, schema, 'SELECT state, attempts, last_error_code, run_at - now() FROM {s}.jobs WHERE id = %s', slow)}")
        logs = w.logs()
        assert w.stop() == 0

    # The outage's lines are those logged before the restart began: pg_ctl returns a
    # moment (on a busy machine, over a second) after the server accepts connections, and
    # what is logged meanwhile (a LISTEN re-established, a "database back", the reaper
    # requeueing a lease that expired during the outage) belongs to the recovery.
    # log_lines has second resolution and one second of slack either side.
    outage = log_lines(logs, down, restart_begins - 2)
    quiet_tail = log_lines(logs, down + 10, restart_begins - 2)
    with capsys.disabled():
        print(f"\noutage {up - down:.1f} s: ready {ready_after:.1f} s after the server returned, new jobs done "
              f"{done_after:.1f} s after; CPU {cpu:.2f} s over {cpu_window:.0f} s; {len(outage)} log lines")
    # once per outage, not once per retry: after the first seconds, a line may only come
    # from a service that had said nothing yet (the pruner's pass comes once a minute, so
    # it may first meet the outage late in it), never a second one from the same service
    said, repeated = set(), []
    for line in outage:
        m = _LINE.match(line)
        speaker = (m.group(3), m.group(5).split(":", 1)[0])  # process, service or logger's subject
        if speaker in said and line in quiet_tail:
            repeated.append(line)
        said.add(speaker)
    assert repeated == [], "\n".join(outage)
    assert any("PostgreSQL" in line and ("unreachable" in line or "cannot connect" in line) for line in outage), \
        "\n".join(outage)
    assert len(outage) <= 12, "\n".join(outage)
    assert any("back after" in line for line in logs.splitlines()), logs[-3000:]
    # no spinning: the worker's processes used well under a tenth of one core
    assert cpu < 0.1 * cpu_window, f"{cpu:.2f} s of CPU over {cpu_window:.0f} s"


def test_read_only_server_is_named_and_work_resumes_when_writable(cluster):
    dsn, schema, port = cluster.dsn(), "readonly", free_port()
    app = _app(dsn, schema)
    with Worker(dsn, schema, "--concurrency", "1", "--metrics-port", str(port), "--metrics-host", "127.0.0.1",
                "--poll-interval", "0.5s", "--reap-interval", "1s", "--lease", "6s") as w:
        wait_until(lambda: http(port, "/readyz")[0] == 200, 60, message="ready")
        cluster.set_read_only(True)
        # a producer pointed at the read-only server gets an error that says so
        from pgworker.errors import DatabaseReadOnly

        with pytest.raises(DatabaseReadOnly, match="read-only"):
            app.enqueue("record", 1)
        # jobs written by a session that turned read-only off for itself: the worker cannot claim them
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("SET default_transaction_read_only = off")
            ids = [q(c, schema, "INSERT INTO {s}.jobs (queue, task, payload) VALUES ('default', 'record', %s) "
                                "RETURNING id", str(i))[0][0] for i in range(5)]
        wait_until(lambda: "read-only" in http(port, "/readyz")[1], 60,
                   message=lambda: f"readyz names the read-only server: {http(port, '/readyz')}")
        assert http(port, "/readyz")[0] == 503
        time.sleep(5)  # claims keep failing meanwhile: logged once, not once per retry
        mentions = [line for line in w.logs().splitlines() if "read-only" in line]
        assert 1 <= len(mentions) <= 4, "\n".join(mentions)
        with psycopg.connect(dsn, autocommit=True) as c:
            assert q(c, schema, "SELECT count(*) FROM {s}.jobs WHERE state = 'pending'")[0][0] == 5
        cluster.set_read_only(False)
        with psycopg.connect(dsn, autocommit=True) as c:
            wait_until(lambda: q(c, schema, "SELECT count(*) FROM {s}.jobs WHERE state = 'succeeded' AND id = ANY(%s)",
                                 ids)[0][0] == 5, 90, message=lambda: f"jobs after recovery; log:\n{w.logs()[-3000:]}")
        wait_until(lambda: http(port, "/readyz")[0] == 200, 60, message="ready again")
        assert w.stop() == 0
