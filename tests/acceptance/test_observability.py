"""Metrics of real `pgworker run` processes, scraped over HTTP: totals across claimers and
kill -9, lease expiry and the fence, queue age, promtool, a real Prometheus server, a real
Pushgateway, and the health endpoints against a PostgreSQL that goes away and comes back."""

from __future__ import annotations

import json
import os
import signal
import time

import psycopg
import pytest
import requests
from psycopg import sql

from obs import (Cluster, free_port, get, prometheus_server, pushgateway_server, require_tool, samples,
                 scrape, series, tcp_client_ports, total, try_scrape, wait_for_metrics, wait_ready)
from pg import wait_until
from worker import HERE, Worker, knowing, q

from pgworker import catalogue as cat

pytestmark = pytest.mark.acceptance

OBS_APP = os.path.join(HERE, "apps", "obs_app.py") + ":app"
FAST_STATS = {"PGWORKER_STATS_CACHE_SECONDS": "0.1"}


@pytest.fixture
def env(app, pg_dsn):
    return knowing(app, pg_dsn, OBS_APP)


def worker(dsn: str, schema: str, *args: str, port: int | None = None, env: dict[str, str] | None = None,
           name: str = "worker") -> Worker:
    port_args = ["--metrics-port", str(port), "--metrics-host", "127.0.0.1"] if port else []
    return Worker(dsn, schema, *args, *port_args, app=OBS_APP, env=env, name=name)


def finished(conn, schema: str, n: int) -> bool:
    rows = dict(q(conn, schema, "SELECT state::text, count(*) FROM {s}.jobs GROUP BY 1"))
    return rows.get("succeeded", 0) + rows.get("dead", 0) == n


def outcome(text: str, name: str) -> float:
    return total(text, "pgworker_jobs_finished_total", outcome=name)


def in_flight(text: str) -> float:
    return total(text, "pgworker_jobs_in_flight")


# -- totals across processes ------------------------------------------------------------


def test_counter_totals_across_claimers_survive_kill_9(env, pg_dsn, conn):
    """30 jobs succeed, 10 fail once then succeed, 5 fail twice and die: the merged
    counters of three claimers say exactly that; killing claimers (one idle that did work,
    one holding a job) loses no count, and the killed holder's in-flight gauge goes."""
    schema = env.settings.schema
    port = free_port()
    expected = {"succeeded": 40, "retried": 15, "dead": 5}
    with worker(pg_dsn, schema, "--concurrency", "3", "--batch-size", "2", "--poll-interval", "0.3",
                port=port) as w:
        wait_ready(port)
        wait_until(lambda: len(w.claimer_pids()) == 3, 30, message="three claimers")
        # enqueued once every claimer runs, so that the NOTIFY puts all three to work
        env.enqueue_many([("ok", i) for i in range(30)] + [("flaky", i) for i in range(10)]
                         + [("doomed", i) for i in range(5)])
        text = wait_for_metrics(port, lambda t: all(outcome(t, k) >= v for k, v in expected.items()), 90,
                                "the workload's outcomes")
        assert finished(conn, schema, 45)
        assert {k: outcome(text, k) for k in ("succeeded", "retried", "dead", "lost")} == {**expected, "lost": 0}
        assert total(text, "pgworker_job_retries_total", error_class="FLAKY") == 10
        assert total(text, "pgworker_job_retries_total", error_class="DOOMED") == 5
        assert total(text, "pgworker_jobs_dead_total", error_class="DOOMED") == 5
        assert total(text, "pgworker_jobs_dead_total") == 5
        assert total(text, "pgworker_claimed_jobs_total") == 60  # attempts: 30 + 2 * 10 + 2 * 5
        assert total(text, "pgworker_job_run_duration_seconds_count") == 60
        assert total(text, "pgworker_job_wait_duration_seconds_count") == 60
        assert total(text, "pgworker_jobs_finished_total", task="flaky", outcome="succeeded") == 10

        pids = dict(q(conn, schema, "SELECT pid, count(*) FROM {s}.ledger GROUP BY pid"))
        assert len(pids) >= 2, f"the claimers shared the work: {pids}"
        busiest = max(pids, key=pids.get)
        assert busiest in w.claimer_pids()

        # kill -9 an idle claimer that did a good share of the work: nothing drops
        os.kill(busiest, signal.SIGKILL)
        wait_until(lambda: len(w.claimer_pids()) == 3 and busiest not in w.claimer_pids(), 30,
                   message="the dispatcher replaced the killed claimer")
        after = scrape(port)
        for k, v in expected.items():
            assert outcome(after, k) == v, k
        assert total(after, "pgworker_claimed_jobs_total") == 60
        assert total(after, "pgworker_job_run_duration_seconds_count") == 60

        # a claimer holding a job: its in-flight gauge shows the job, and goes with it
        hold = env.enqueue("hold", 120)
        wait_for_metrics(port, lambda t: in_flight(t) == 1, 30, "the held job in flight")
        holder = wait_until(lambda: q(conn, schema, "SELECT pid FROM {s}.ledger WHERE job_id = %s", hold), 30)[0][0]
        os.kill(holder, signal.SIGKILL)
        # the dispatcher settles the job (WORKER_DIED: dead, it had one attempt) and
        # marks the process dead, which removes its live gauges
        last = wait_for_metrics(port, lambda t: outcome(t, "dead") == 6 and in_flight(t) == 0, 30,
                                "the killed holder's job dead and its in-flight gauge gone")
        assert outcome(last, "succeeded") == 40 and outcome(last, "retried") == 15
        assert total(last, "pgworker_jobs_dead_total", error_class="WORKER_DIED") == 1
        assert total(last, "pgworker_claimed_jobs_total") == 61
        assert total(last, "pgworker_job_run_duration_seconds_count") == 60  # the killed run never ended
        assert w.stop() == 0
    assert q(conn, schema, "SELECT state::text, last_error_code FROM {s}.jobs WHERE id = %s", hold) == \
        [("dead", "WORKER_DIED")]


def test_recycled_claimers_leave_a_bounded_number_of_metric_files(env, pg_dsn, conn, tmp_path):
    """--max-jobs-per-child 1: every job ends its claimer's life. Each gone claimer's
    counters and histograms are merged into the pod's compacted files, so the directory
    holds the live processes' files plus a few (it kept three files per process ever
    started: 51 from 17 processes after 15 jobs, all merged at every scrape), and the
    totals scraped over HTTP meanwhile never go backwards and end exact."""
    schema = env.settings.schema
    n = 20
    metrics_dir = tmp_path / "metrics"
    port = free_port()
    watched = {"claimed": ("pgworker_claimed_jobs_total", {}),
               "succeeded": ("pgworker_jobs_finished_total", {"outcome": "succeeded"}),
               "runs": ("pgworker_job_run_duration_seconds_count", {}),
               "run_seconds": ("pgworker_job_run_duration_seconds_sum", {}),
               "claims": ("pgworker_claims_total", {}),
               "waits_under_1s": ("pgworker_job_wait_duration_seconds_bucket", {"le": "1.0"})}
    seen: list[dict[str, float]] = []

    def scraped() -> dict[str, float] | None:
        text = try_scrape(port)
        if text is None:
            return None
        seen.append({k: total(text, name, **labels) for k, (name, labels) in watched.items()})
        return seen[-1]

    with worker(pg_dsn, schema, "--concurrency", "2", "--max-jobs-per-child", "1", "--batch-size", "1",
                "--poll-interval", "0.3", "--metrics-dir", str(metrics_dir), port=port) as w:
        wait_ready(port)
        env.enqueue_many([("ok", i) for i in range(n)])
        wait_until(lambda: (scraped() or {}).get("succeeded") == n, 180, 0.1,
                   message=lambda: f"{n} jobs through recycled claimers; last scrape {seen[-1:]}")
        assert finished(conn, schema, n)
        final = scraped()
        files = sorted(p.name for p in metrics_dir.glob("*.db"))
        assert w.stop() == 0
    started = w.logs().count("recycling")
    assert started >= n - 2, f"the claimers were recycled ({started} times)"
    # the supervisor and two claimers (counter, histogram, three kinds of gauge each), and
    # one compacted file per kind of merged value
    assert len(files) <= 3 * 5 + 3, files
    assert (final["claimed"], final["succeeded"], final["runs"]) == (n, n, n)
    for before, after in zip(seen, seen[1:]):
        for key in watched:
            assert after[key] >= before[key], (key, before, after)


def test_the_error_class_cap_holds_for_the_pod_across_recycled_claimers(env, pg_dsn, conn):
    """30 distinct handler error classes, one job each, through claimers recycled after
    every job: the pod exports the first 20 (catalogue.ERROR_CLASS_TOP_N) and folds the
    rest into 'other', counting every one (each claimer had a budget of its own, and each
    replacement a new one: 29 classes seen from one pod)."""
    schema = env.settings.schema
    n, cap = 30, cat.ERROR_CLASS_TOP_N
    port = free_port()
    with worker(pg_dsn, schema, "--concurrency", "2", "--max-jobs-per-child", "1", "--batch-size", "1",
                "--poll-interval", "0.3", port=port) as w:
        wait_ready(port)
        env.enqueue_many([("fail_as", f"E{i:02d}") for i in range(n)])
        text = wait_for_metrics(port, lambda t: total(t, "pgworker_jobs_dead_total") == n, 180,
                                "every job dead")
        assert w.stop() == 0
    assert w.logs().count("recycling") >= n - 2
    ours = {labels["error_class"]: v for labels, v in series(text, "pgworker_jobs_dead_total")
            if labels["error_class"] not in cat.KNOWN_ERROR_CODES}
    named = {k for k, v in ours.items() if k != cat.OTHER and v > 0}
    assert len(named) == cap, sorted(named)
    assert ours[cat.OTHER] == n - cap
    assert all(ours[k] == 1 for k in named)


def test_claimer_heartbeat_stays_fresh_while_a_long_job_runs(env, pg_dsn):
    """The livemin heartbeat is the oldest beat of the live claimers: it moves on while a
    job keeps the only claimer's loop busy, and the dispatcher never drags it to 0."""
    schema = env.settings.schema
    port = free_port()
    env.enqueue("hold", 20)
    with worker(pg_dsn, schema, "--concurrency", "1", "--shutdown-grace", "0", "--lease", "2", port=port) as w:
        text = wait_for_metrics(port, lambda t: in_flight(t) == 1, 30, "the long job running")
        first = total(text, "pgworker_claimer_heartbeat_timestamp_seconds")
        assert first > 0
        later = wait_for_metrics(
            port, lambda t: total(t, "pgworker_claimer_heartbeat_timestamp_seconds") >= first + 2.5, 30,
            "the heartbeat to move on while the job runs")
        assert in_flight(later) == 1  # still the same job
        # the dispatcher renewed its lease meanwhile (every lease/3), all accepted
        assert total(later, "pgworker_lease_renewals_total", result="renewed") >= 2
        assert total(later, "pgworker_lease_renewals_total", result="lost") == 0
        w.stop()


# -- the pod's loops: when each last went round --------------------------------------------


def service_loops(text: str) -> dict[str, float]:
    return {ls["loop"]: v for ls, v in series(text, "pgworker_loop_last_success_timestamp_seconds")}


def claimer_loops(text: str) -> dict[str, float]:
    return {ls["claimer"]: v for ls, v in series(text, "pgworker_claimer_loop_last_success_timestamp_seconds")}


def test_a_stalled_background_loop_shows_in_its_last_success(env, pg_dsn, conn):
    """Every service of the pod and every claimer loop exports when it last went round.
    The test locks the jobs table: the reaper's and the pruner's passes wait on it and their
    timestamps stop, while the services that need no row go on; after the lock, they move
    again. A claimer running a long job says so, and its loop stands still meanwhile."""
    schema = env.settings.schema
    port = free_port()
    fast = {"PGWORKER_PRUNE_INTERVAL_SECONDS": "0.5"}
    with worker(pg_dsn, schema, "--concurrency", "2", "--reap-interval", "0.5", "--lease", "3",
                "--poll-interval", "0.3", "--no-stats", port=port, env=fast) as w:
        services = {"renewer", "settler", "listener", "reaper", "pruner", "registry"}
        text = wait_for_metrics(port, lambda t: set(service_loops(t)) == services and len(claimer_loops(t)) == 2,
                                60, "a last-success timestamp for every service and claimer")
        intervals = {ls["loop"]: v for ls, v in series(text, "pgworker_loop_interval_seconds")}
        assert intervals["reaper"] == 0.5 and intervals["pruner"] == 0.5 and intervals["renewer"] == 1.0
        first = service_loops(text)
        wait_for_metrics(port, lambda t: all(v > first[k] + 1 for k, v in service_loops(t).items()), 30,
                         "every service to complete passes")

        with psycopg.connect(pg_dsn) as locker:
            locker.execute(sql.SQL("LOCK TABLE {}.jobs IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(schema)))
            held_at = time.time()
            text = wait_for_metrics(port, lambda t: min(service_loops(t)[k] for k in ("listener", "settler", "renewer"))
                                    > held_at + 3, 30, "the services that need no row to go on")
            stalled = service_loops(text)
            assert stalled["reaper"] < held_at + 0.5 and stalled["pruner"] < held_at + 0.5, (held_at, stalled)
            locker.rollback()
        released = time.time()
        wait_for_metrics(port, lambda t: min(service_loops(t)[k] for k in ("reaper", "pruner")) > released, 30,
                         "the reaper and the pruner back")

        job = env.enqueue("hold", 4)
        text = wait_for_metrics(port, lambda t: total(t, "pgworker_claimer_handler_running") == 1, 30,
                                "the long job's claimer")
        [(busy, _)] = [(ls["claimer"], v) for ls, v in series(text, "pgworker_claimer_handler_running") if v == 1]
        started = claimer_loops(text)[busy]
        later = wait_for_metrics(port, lambda t: all(v > started + 2 for k, v in claimer_loops(t).items() if k != busy)
                                 and total(t, "pgworker_claimer_handler_running") == 1, 30,
                                 "the idle claimer's loop to go round while the job runs")
        assert claimer_loops(later)[busy] == pytest.approx(started, abs=0.05)  # its loop waits for the handler
        wait_until(lambda: q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", job) == [("succeeded",)],
                   30, message="the long job")
        wait_for_metrics(port, lambda t: total(t, "pgworker_claimer_handler_running") == 0
                         and claimer_loops(t)[busy] > started + 0.5, 30, "its loop back")
        assert w.stop() == 0


# -- leases, the reaper and the fence ----------------------------------------------------


def test_expired_lease_shows_then_is_reaped_and_the_stale_completion_is_fenced(env, pg_dsn, conn):
    """Worker A runs a job whose lease nobody renews (its dispatcher is stopped); the job
    shows in B's pgworker_queue_expired_leases (the test holds the row so that B's reaper
    skips it meanwhile), then B's reaper counts it in pgworker_lease_expirations_total,
    and A's late completion is refused by the fence: pgworker_fenced_writes_total."""
    schema = env.settings.schema
    job = env.enqueue("outlive_lease")
    port_a, port_b = free_port(), free_port()
    fast = ["--lease", "2", "--poll-interval", "0.3"]
    with worker(pg_dsn, schema, "--concurrency", "1", *fast, port=port_a, name="a") as a:
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE event = 'start'"), 30,
                   message="A started the job")
        a.signal(signal.SIGSTOP)  # the dispatcher: no more renewals; the claimer runs on
        with psycopg.connect(pg_dsn) as holder:
            q(holder, schema, "SELECT id FROM {s}.jobs WHERE id = %s FOR UPDATE", job)
            with worker(pg_dsn, schema, "--concurrency", "1", "--reap-interval", "0.5", *fast,
                        port=port_b, env=FAST_STATS, name="b") as b:
                wait_for_metrics(port_b, lambda t: total(t, "pgworker_queue_expired_leases", queue="default") == 1,
                                 30, "the expired lease in B's statistics")
                holder.rollback()  # B's reaper may take it now; A's completion goes through the fence
                text = wait_for_metrics(
                    port_b, lambda t: total(t, "pgworker_lease_expirations_total", action="requeued") == 1, 30,
                    "B's reaper to count the expiration")
                assert total(text, "pgworker_lease_expirations_total", action="dead") == 0
                wait_until(lambda: q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", job)
                           == [("succeeded",)], 30, message="B ran the requeued job")
                wait_for_metrics(port_b, lambda t: total(t, "pgworker_queue_expired_leases") == 0, 30,
                                 "the expired-lease gauge back to 0")
                b.stop()
        a.signal(signal.SIGCONT)
        text = wait_for_metrics(port_a, lambda t: total(t, "pgworker_fenced_writes_total", operation="complete") == 1,
                                30, "A's refused completion")
        assert outcome(text, "lost") == 1 and outcome(text, "succeeded") == 0
        assert a.stop() == 0
    assert q(conn, schema, "SELECT state::text, lease_token FROM {s}.jobs WHERE id = %s", job) == [("succeeded", 2)]


def test_a_row_the_reaper_cannot_write_is_counted_and_logged_and_the_rest_reaped(env, pg_dsn, conn):
    """A CHECK constraint a user added refuses the reap of one expired lease: the worker's
    reaper reaps the rest of its batch, counts the row in pgworker_reap_failed_total and
    logs it once (it once failed the whole batch on every pass), and the pod stays ready."""
    schema = env.settings.schema
    insert = ("INSERT INTO {s}.jobs (queue, task, payload, state, attempts, lease_token, lease_owner, "
              "lease_expires_at) VALUES ('default', 'ok', %s::jsonb, 'running', 1, 1, 'gone', "
              "now() - interval '1 minute') RETURNING id")
    good = [q(conn, schema, insert, "1")[0][0] for _ in range(5)]
    [bad] = q(conn, schema, insert, '"poison"')[0]
    conn.execute(psycopg.sql.SQL("""ALTER TABLE {}.jobs ADD CONSTRAINT users_own_rule
                                    CHECK (state <> 'pending' OR payload <> '"poison"'::jsonb)""")
                 .format(psycopg.sql.Identifier(schema)))
    port = free_port()
    with worker(pg_dsn, schema, "--concurrency", "1", "--reap-interval", "0.5", "--poll-interval", "0.3",
                port=port) as w:
        text = wait_for_metrics(port, lambda t: total(t, "pgworker_reap_failed_total", queue="default") == 1
                                and total(t, "pgworker_lease_expirations_total", action="requeued") == 5, 30,
                                "the rest of the batch reaped, the bad row counted")
        wait_until(lambda: finished(conn, schema, 5), 30, message=lambda: w.logs()[-3000:])
        wait_ready(port)
        assert w.stop() == 0
        logs = w.logs()
    assert total(text, "pgworker_reap_failed_total") == 1
    assert logs.count(f"job {bad} (queue 'default') cannot be reaped") == 1, logs[-3000:]
    assert "users_own_rule" in logs and "poison" not in logs  # the server's DETAIL quotes the row: never logged
    assert q(conn, schema, "SELECT state::text, last_error_code FROM {s}.jobs WHERE id = %s", bad) == [
        ("running", "REAP_FAILED")]
    assert len(good) == 5


def test_a_stuck_due_job_makes_the_oldest_age_grow(env, pg_dsn, conn):
    schema = env.settings.schema
    job = env.enqueue("ok")
    port = free_port()
    with psycopg.connect(pg_dsn) as holder:
        q(holder, schema, "SELECT id FROM {s}.jobs WHERE id = %s FOR UPDATE", job)  # claims skip it
        with worker(pg_dsn, schema, "--concurrency", "1", "--poll-interval", "0.3", port=port, env=FAST_STATS) as w:
            age = lambda t: total(t, "pgworker_queue_oldest_job_age_seconds", queue="default")  # noqa: E731
            first = age(wait_for_metrics(port, lambda t: age(t) > 0, 30, "an oldest-age sample"))
            text = wait_for_metrics(port, lambda t: age(t) >= first + 2, 30, "the oldest age to grow")
            assert total(text, "pgworker_queue_jobs", queue="default", state="due") == 1
            assert total(text, "pgworker_queue_stats_up") == 1
            holder.rollback()
            wait_for_metrics(port, lambda t: age(t) == 0 and outcome(t, "succeeded") == 1, 30,
                             "the job to run and the age to fall to 0")
            w.stop()


# -- the exposition: catalogue, promtool ---------------------------------------------------


@pytest.fixture
def exposition(env, pg_dsn, conn):
    """/metrics of a worker that ran a bit of everything (text as scraped)."""
    schema = env.settings.schema
    env.enqueue_many([("ok", 1), ("flaky", 2), ("doomed", 3)])
    port = free_port()
    with worker(pg_dsn, schema, "--concurrency", "2", "--poll-interval", "0.3", port=port) as w:
        text = wait_for_metrics(port, lambda t: outcome(t, "dead") == 1 and outcome(t, "succeeded") == 2
                                and total(t, "pgworker_claimer_heartbeat_timestamp_seconds") > 0, 60,
                                "the small workload")
        w.stop()
    return text


def test_every_catalogued_metric_is_exposed_by_a_running_worker(exposition):
    exposed = {n for n, _, _ in samples(exposition)}
    for m in cat.METRICS:
        if m.source == "drain":
            continue  # pushed by drain runs: see test_drain_pushes_its_summary_to_a_real_pushgateway
        missing = [n for n in cat.exposed_names(m) if n not in exposed]
        assert not missing, f"{m.name} is in the catalogue but the worker does not expose {missing}"
    ours = {n for n in exposed if n.startswith("pgworker_")}
    assert ours <= cat.all_series_names(), f"not in the catalogue: {sorted(ours - cat.all_series_names())}"


def test_exposed_labels_are_the_catalogued_ones_with_bounded_values(exposition):
    allowed = {"outcome": set(cat.OUTCOMES), "action": set(cat.EXPIRATION_ACTIONS),
               "operation": set(cat.FENCED_OPERATIONS), "reason": set(cat.WAKEUP_REASONS),
               "state": set(cat.STATS_STATES), "queue": {"default"}, "loop": set(cat.LOOPS),
               "claimer": {"0", "1"}}
    defs = {n: m for m in cat.METRICS for n in cat.exposed_names(m)}
    for name, labels, _ in samples(exposition):
        if not name.startswith("pgworker_"):
            continue
        m = defs[name]
        extra = {"le"} if name.endswith("_bucket") else set()
        assert set(labels) == set(m.labels) | extra, (name, labels)
        for label, value in labels.items():
            if label in allowed:
                assert value in allowed[label], (name, label, value)
        if "result" in labels:
            assert labels["result"] in {*cat.CLAIM_RESULTS, *cat.RENEW_RESULTS, *cat.EFFECT_RECONCILE_RESULTS}
        if "error_class" in labels:
            assert labels["error_class"] in {"FLAKY", "DOOMED", cat.OTHER, *cat.KNOWN_ERROR_CODES}


def test_promtool_accepts_the_exposition(exposition, tmp_path):
    promtool = require_tool("promtool", "Debian: apt-get install -y prometheus")
    import subprocess

    result = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), \
        f"promtool check metrics:\n{result.stdout}\n{result.stderr}"


def test_no_stats_means_no_statistics_query(env, pg_dsn, conn):
    """--no-stats: no pgworker_queue_* gauges, and the dispatcher never opens its
    statistics session (the one that stays open between scrapes when they are on)."""
    schema = env.settings.schema
    port = free_port()
    env.enqueue("ok")

    def stats_sessions(w: Worker) -> list:
        return q(conn, schema, "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgworker:stats' "
                               "AND client_port = ANY(%s)", sorted(tcp_client_ports(w.pid)))

    with worker(pg_dsn, schema, "--concurrency", "1", "--no-stats", port=port) as w:
        text = wait_for_metrics(port, lambda t: outcome(t, "succeeded") == 1, 30, "the job")
        for _ in range(3):
            text = scrape(port)
        assert not [n for n, _, _ in samples(text) if n.startswith("pgworker_queue_")]
        assert not stats_sessions(w)
        w.stop()
    # the control: with statistics on, a scrape leaves the statistics session open
    with worker(pg_dsn, schema, "--concurrency", "1", port=port) as w:
        wait_for_metrics(port, lambda t: total(t, "pgworker_queue_stats_up") == 1, 30, "the statistics")
        assert stats_sessions(w)
        w.stop()


# -- a real Prometheus server ------------------------------------------------------------


def test_a_real_prometheus_ingests_the_metrics_and_answers_the_documented_queries(env, pg_dsn, conn):
    from pgworker.metrics_questions import all_queries

    schema = env.settings.schema
    job = env.enqueue("ok")
    port = free_port()
    with psycopg.connect(pg_dsn) as holder:
        q(holder, schema, "SELECT id FROM {s}.jobs WHERE id = %s FOR UPDATE", job)  # a job waiting: age > 0
        with worker(pg_dsn, schema, "--concurrency", "1", port=port, env=FAST_STATS) as w, \
                prometheus_server(port) as prom:
            wait_ready(port)

            def query(expr: str) -> dict:
                r = requests.get(prom.url("/api/v1/query"), params={"query": expr}, timeout=10)
                body = r.json()
                assert r.status_code == 200 and body["status"] == "success", (expr, body)
                return body["data"]

            def oldest_age() -> list:
                return [r for r in query('pgworker_queue_oldest_job_age_seconds{queue="default"}')["result"]
                        if float(r["value"][1]) > 0]

            result = wait_until(oldest_age, 60, 0.5, message=lambda: f"Prometheus to ingest the age; {prom.logs()}")
            assert result[0]["metric"]["job"] == "pgworker" and result[0]["metric"]["instance"] == f"127.0.0.1:{port}"
            # every query of docs/observability.md parses and runs on a real Prometheus
            for expr in all_queries():
                query(expr)
            up = query("up")["result"]
            assert [float(r["value"][1]) for r in up] == [1.0]
            w.stop()


# -- drain mode: the JSON line and a real Pushgateway ------------------------------------


def test_drain_pushes_its_summary_to_a_real_pushgateway(env, pg_dsn, conn):
    schema = env.settings.schema
    env.enqueue_many([("ok", i) for i in range(8)] + [("flaky", 1), ("doomed", 2)])
    with pushgateway_server() as gw:
        with worker(pg_dsn, schema, "--drain", "--concurrency", "2", "--pushgateway-url", gw.url()) as w:
            assert w.wait(90) == 0
            lines = w.stdout().strip().splitlines()
        summary = json.loads(lines[-1])
        assert summary["event"] == "drain_summary" and summary["result"] == "succeeded"
        assert (summary["processed"], summary["succeeded"], summary["retried"], summary["dead"], summary["left"]) == \
            (12, 9, 2, 1, 0)
        assert summary["duration_seconds"] > 0
        pushed = requests.get(gw.url("/metrics"), timeout=10).text
        group = {"job": "pgworker_drain", "schema": schema}
        for m in cat.METRICS:
            if m.source == "drain":
                assert [1 for n, ls, _ in samples(pushed) if n == m.name and ls.items() >= group.items()], \
                    f"{m.name} did not reach the Pushgateway"
        assert total(pushed, "pgworker_drain_jobs_processed", outcome="succeeded", **group) == 9
        assert total(pushed, "pgworker_drain_jobs_processed", outcome="retried", **group) == 2
        assert total(pushed, "pgworker_drain_jobs_processed", outcome="dead", **group) == 1
        assert total(pushed, "pgworker_drain_jobs_left", **group) == 0
        [(labels, stamp)] = series(pushed, "pgworker_drain_last_run_timestamp_seconds")
        assert labels["result"] == "succeeded" and stamp > 0

        # a run that hits its deadline replaces the group: the result says so
        # two attempts: the one cut short at the deadline fails SHUTDOWN and is due again (left 1)
        env.enqueue("hold", 30, max_attempts=2)
        with worker(pg_dsn, schema, "--drain", "--concurrency", "1", "--max-duration", "1",
                    "--shutdown-grace", "0", "--pushgateway-url", gw.url()) as w:
            assert w.wait(60) == 75
            summary = json.loads(w.stdout().strip().splitlines()[-1])
        assert summary["result"] == "deadline" and summary["left"] == 1
        pushed = requests.get(gw.url("/metrics"), timeout=10).text
        [(labels, _)] = series(pushed, "pgworker_drain_last_run_timestamp_seconds")
        assert labels["result"] == "deadline"
        assert total(pushed, "pgworker_drain_jobs_left", **group) == 1


def test_drain_prints_its_summary_when_the_pushgateway_is_unreachable(env, pg_dsn):
    env.enqueue("ok")
    dead_end = f"http://127.0.0.1:{free_port()}"
    with worker(pg_dsn, env.settings.schema, "--drain", "--concurrency", "1", "--pushgateway-url", dead_end) as w:
        assert w.wait(60) == 0
        summary = json.loads(w.stdout().strip().splitlines()[-1])
        assert summary["succeeded"] == 1
        assert "pushing the drain summary" in w.logs()


def test_drain_duration_survives_the_wall_clock_stepping_back(env, pg_dsn, conn, tmp_path):
    """The supervisor's wall clock steps back an hour while its job runs (an NTP step, a VM
    resumed from a snapshot; tests/apps/wallclock_step.py moves only that process's
    time.time): the summary line and the pushed gauge still say how long the run took,
    not about -3600 s. The run's last-run timestamp is wall-clock time, as it should be."""
    flag = tmp_path / "step-and-finish"
    env.enqueue("wait_for_file", str(flag))
    launcher = os.path.join(HERE, "apps", "wallclock_step.py")
    with pushgateway_server() as gw:
        with Worker(pg_dsn, env.settings.schema, "--drain", "--concurrency", "1", "--pushgateway-url", gw.url(),
                    app=OBS_APP, env={"WALLCLOCK_STEP_FLAG": str(flag)}, launcher=launcher, name="clock") as w:
            wait_until(lambda: q(conn, env.settings.schema, "SELECT 1 FROM {s}.ledger WHERE event = 'start'"), 60,
                       message="the job to start")
            flag.touch()  # the supervisor's clock steps back; the job ends
            assert w.wait(60) == 0
            summary = json.loads(w.stdout().strip().splitlines()[-1])
        assert summary["succeeded"] == 1
        assert 0 < summary["duration_seconds"] < 600, summary
        pushed = requests.get(gw.url("/metrics"), timeout=10).text
        [(_, duration)] = series(pushed, "pgworker_drain_duration_seconds")
        assert 0 < duration < 600


# -- /healthz and /readyz ----------------------------------------------------------------


def test_healthz_and_readyz_follow_the_database(tmp_path):
    """/readyz: not ready before the worker has connected, ready once connected, on the
    current schema and listening; not ready while the database is gone, ready again after.
    /healthz answers 200 throughout: it never touches the database."""
    from pgworker import App, Settings

    with Cluster() as cluster:
        cluster.start()
        schema = "pgworker_readyz"
        App(settings=Settings.from_env(environ={}, dsn=cluster.dsn, schema=schema)).migrate()
        cluster.stop()
        port = free_port()
        w = Worker(cluster.dsn, schema, "--concurrency", "1", "--reap-interval", "0.5",
                   "--metrics-port", str(port), "--metrics-host", "127.0.0.1", app=OBS_APP, name="readyz")
        with w:
            def status(path: str) -> int | None:
                try:
                    return get(port, path, timeout=5).status_code
                except requests.RequestException:
                    return None

            wait_until(lambda: status("/healthz") == 200, 30, message="the HTTP server")
            r = get(port, "/readyz")
            assert r.status_code == 503 and "not ready" in r.text
            cluster.start()
            wait_ready(port, 60)
            assert status("/healthz") == 200
            cluster.stop()
            wait_until(lambda: status("/readyz") == 503, 60, 0.1, message="not ready without the database")
            r = get(port, "/readyz")
            assert "not ready" in r.text
            for _ in range(5):
                assert status("/healthz") == 200
            text = scrape(port)  # /metrics still answers, fast, without the statistics
            assert total(text, "pgworker_queue_stats_up") == 0
            cluster.start()
            wait_ready(port, 90)
            assert w.stop() == 0


# -- traces across processes ---------------------------------------------------------------


def _json_objects(text: str) -> list[dict]:
    """Every JSON object in a stream of them (the console exporter pretty-prints spans)."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while True:
        i = text.find("{", i)
        if i < 0:
            return out
        try:
            obj, i = decoder.raw_decode(text, i)
            out.append(obj)
        except json.JSONDecodeError:
            i += 1


def test_claimers_set_up_tracing_from_otel_env_and_flush_before_exit(env, pg_dsn):
    """The trace context travels in the job row from this process to the claimer
    processes; each claimer builds its SDK from OTEL_* variables (here the console
    exporter, which prints to the worker's stdout) and flushes it before exiting: a
    drain run is shorter than the batch processor's 5 s export delay."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from pgworker import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.set_tracer_provider(provider)
    try:
        env.enqueue("flaky")
    finally:
        tracing.set_tracer_provider(None)
    [send] = exporter.get_finished_spans()
    otel = {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "pgworker-under-test"}
    with worker(pg_dsn, env.settings.schema, "--drain", "--concurrency", "2", "--trace-sql", env=otel) as w:
        assert w.wait(60) == 0
        spans = [o for o in _json_objects(w.stdout()) if "name" in o and "context" in o]
    process = [s for s in spans if s["name"] == "process default"]
    settle = [s for s in spans if s["name"] == "settle default"]
    assert len(process) == 2 and len(settle) == 2, [s["name"] for s in spans]
    send_trace, send_span = f"0x{send.context.trace_id:032x}", f"0x{send.context.span_id:016x}"
    assert {s["context"]["trace_id"] for s in process + settle} == {send_trace}
    assert {s["parent_id"] for s in process} == {send_span}
    assert {s["parent_id"] for s in settle} == {s["context"]["span_id"] for s in process}
    assert sorted(s["attributes"]["pgworker.job.attempt"] for s in process) == [1, 2]
    assert {s["resource"]["attributes"]["service.name"] for s in spans} == {"pgworker-under-test"}
    # --trace-sql: the claim statement is a child of its receive span, the handler's
    # ledger insert a child of its process span
    receives = {s["context"]["span_id"] for s in spans if s["name"] == "receive default"}
    assert [s for s in spans if s["name"] == "WITH" and s["parent_id"] in receives]
    processes = {s["context"]["span_id"] for s in process}
    assert [s for s in spans if s["name"] == "INSERT" and s["parent_id"] in processes]

    env.enqueue("ok")
    with worker(pg_dsn, env.settings.schema, "--drain", "--concurrency", "1", "--no-tracing", env=otel) as w:
        assert w.wait(60) == 0
        assert not [o for o in _json_objects(w.stdout()) if "context" in o]


def test_wakeups_by_reason_and_listener_reconnects(env, pg_dsn, conn):
    schema = env.settings.schema
    port = free_port()
    with worker(pg_dsn, schema, "--concurrency", "1", "--poll-interval", "0.5", port=port) as w:
        wait_ready(port)
        env.enqueue("ok")
        text = wait_for_metrics(port, lambda t: outcome(t, "succeeded") == 1
                                and total(t, "pgworker_dispatcher_wakeups_total", reason="notify") >= 1
                                and total(t, "pgworker_dispatcher_wakeups_total", reason="poll") >= 1, 30,
                                "wake-ups by NOTIFY and by the fallback poll")
        assert total(text, "pgworker_listener_reconnects_total") == 0
        listener = q(conn, schema, "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgworker:listener' "
                                   "AND client_port = ANY(%s)", sorted(tcp_client_ports(w.pid)))
        assert len(listener) == 1
        conn.execute("SELECT pg_terminate_backend(%s)", listener[0])
        text = wait_for_metrics(port, lambda t: total(t, "pgworker_listener_reconnects_total") == 1
                                and total(t, "pgworker_dispatcher_wakeups_total", reason="reconnect") == 1, 30,
                                "the listener to reconnect")
        wait_ready(port)
        assert w.stop() == 0


def test_otel_traces_exporter_otlp_exports_over_http_with_the_otlp_extra(env, pg_dsn):
    """OTEL_TRACES_EXPORTER=otlp, as docs/deploy.md says to set it, with only the HTTP
    exporter installed (the `otlp` extra): spans reach an OTLP/HTTP receiver. Before, `otlp`
    was looked up among the entry points by that name, which only the gRPC package
    registers, and traces were silently off (one warning)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    received: list[str] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            request = ExportTraceServiceRequest.FromString(body)
            received.extend(s.name for r in request.resource_spans for ss in r.scope_spans for s in ss.spans)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env.enqueue("ok")
        otel = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_port}"}
        with worker(pg_dsn, env.settings.schema, "--drain", "--concurrency", "1", env=otel) as w:
            assert w.wait(60) == 0, w.logs()[-2000:]
            assert "no such exporter" not in w.logs()
        assert "process default" in received and "settle default" in received, received
    finally:
        server.shutdown()
